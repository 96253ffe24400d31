"""Every command in the README's code blocks (and in results/tuning/README.md's, which says how
the alpha/beta picks were made, and in docs/full_scale.md's, the guide to the full-scale tables)
still works as written.

* `train_gpt2.py` / `train_vit.py` commands (plain, `-m` multiruns, `torchrun`): every cell is
  expanded and composed as Hydra would launch it (`horst-sparse plan`'s expansion) and passes
  the pipeline's checks, with the process count torchrun gives. They need ImageNet,
  SlimPajama, a GPU or a cluster at full size; tiny versions of them run in the pipeline,
  launcher and preemption tests.
* `scripts/` and `bench/` commands: every flag they use is one the script takes (`--help`).
* `make` targets exist in the Makefile.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def readme_commands(readme: Path = ROOT / "README.md") -> list[str]:
    text = readme.read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                commands.append(line.split("  #")[0].split(" # ")[0].split(" | ")[0].strip())
    return commands


def words(command: str) -> list[str]:
    """The command without environment assignments, the interpreter and torchrun's options."""
    parts = [w for w in shlex.split(re.sub(r"<[^>]+>", "x", command)) if not re.match(r"^[A-Z_]+=", w)]
    if parts[0] == "torchrun":
        parts = [p for p in parts[1:] if not p.startswith("--nproc_per_node")]
    return parts[1:] if parts[0].endswith("python") else parts


COMMANDS = readme_commands()
# results/tuning/README.md: how the pipelines' alpha/beta picks were made (its shell loop's
# variable at its first value)
TUNING = [
    c.replace("$seed", "0")
    for c in readme_commands(ROOT / "results" / "tuning" / "README.md")
    if c.startswith(("python ", "horst-"))
]
GUIDE = readme_commands(ROOT / "docs" / "full_scale.md")
EVERY = list(dict.fromkeys(COMMANDS + TUNING + GUIDE))  # a command in two of them is tested once
ENTRY = [c for c in EVERY if re.search(r"\btrain_(gpt2|vit)\.py\b", c) and "horst-sparse plan" not in c]
SCRIPTS = [c for c in EVERY if re.search(r"\b(scripts|bench)/\w+\.py\b|(^|/)horst-sparse\b", c)]
MAKE = [c for c in COMMANDS if c.startswith("make ")]
SOURCE = [c for c in COMMANDS if c.startswith("source ")]


def test_the_readme_has_the_commands_this_test_knows():
    assert len(ENTRY) >= 15 and len(SCRIPTS) >= 8 and MAKE
    known = set(ENTRY) | set(SCRIPTS) | set(MAKE) | set(SOURCE)
    assert set(COMMANDS) <= known, set(COMMANDS) - known
    assert len(TUNING) == 13 and set(TUNING) <= set(ENTRY) | set(SCRIPTS)
    assert GUIDE and set(GUIDE) <= set(ENTRY) | set(SCRIPTS)


@pytest.mark.parametrize("command", ENTRY)
def test_entry_point_command_composes_and_passes_the_checks(command):
    from horst_sparse import plan  # horst-sparse plan: Hydra's own multirun expansion

    script, *overrides = [w for w in words(command) if w != "-m"]
    torchrun = int(re.search(r"--nproc_per_node=(\d+)", command).group(1)) if "torchrun" in command else None
    pipeline, _, cells = plan.plan(ROOT / script, overrides)
    from omegaconf import open_dict

    assert cells
    for cell in cells:
        processes = torchrun or plan.world_size(cell.config)  # a SLURM launcher's tasks, as the run will see them
        config = cell.config.copy()
        with open_dict(config):
            del config["hydra"]
        pipeline.checks.config(config, world_size=processes)


@pytest.mark.parametrize("command", SCRIPTS)
def test_script_command_uses_only_flags_the_script_takes(command):
    parts = words(command)
    at, script = next(
        (i, p) for i, p in enumerate(parts) if re.match(r"^(scripts|bench)/\w+\.py$|^(.*/)?horst-sparse$", p)
    )
    installed = Path(sys.executable).parent / "horst-sparse"  # the one command, installed beside this Python
    if script.endswith("horst-sparse"):
        command_line = [str(installed), parts[at + 1]]  # the command and its subcommand
    else:
        command_line = [sys.executable, str(ROOT / script)]
    assert (installed if script.endswith("horst-sparse") else ROOT / script).is_file(), script
    flags = {p.split("=")[0] for p in parts if p.startswith("--")}
    if command_line[1:] == ["plan"]:
        return  # its arguments are an entry point's: test_entry_point_command_... covers the same commands
    if flags:
        help_text = subprocess.run(
            [*command_line, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
        ).stdout
        assert all(flag in help_text for flag in flags), (script, flags, help_text[-500:])


@pytest.mark.parametrize("command", MAKE)
def test_make_target_exists(command):
    target = command.split()[1]
    assert re.search(rf"^{re.escape(target)}:", (ROOT / "Makefile").read_text(), re.M), target


@pytest.mark.parametrize("command", SOURCE)
def test_the_environment_the_readme_activates_is_the_one_make_builds(command):
    """`source .venv/bin/activate` puts this interpreter and its horst-sparse command first on PATH."""
    activate = ROOT / command.split()[1]
    assert activate == Path(sys.prefix) / "bin" / "activate" or not (ROOT / ".venv").exists(), (activate, sys.prefix)
    done = subprocess.run(
        ["bash", "-c", f"source {activate} && command -v python horst-sparse"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0 and done.stdout.split() == [
        str(activate.parent / "python"),
        str(activate.parent / "horst-sparse"),
    ]
