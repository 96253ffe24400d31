"""`horst-sparse`, the one command: every subcommand answers --help under its own name, a misspelt one
is named with the closest, and the package installs no other command."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from conftest import HORST_SPARSE, ROOT

from horst_sparse import cli


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_subcommand_has_help_under_its_own_name(name):
    done = subprocess.run([HORST_SPARSE, name, "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: horst-sparse {name} "), done.stdout[:200]


def test_the_list_names_every_subcommand_and_a_misspelt_one_gets_the_closest():
    listed = subprocess.run([HORST_SPARSE, "--help"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and all(f"\n  {name} " in listed.stdout for name in cli.COMMANDS)
    wrong = subprocess.run([HORST_SPARSE, "stuyd", "--report-only"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and wrong.stderr == "error: horst-sparse has no command 'stuyd'; did you mean study?\n"


def test_horst_sparse_is_the_only_installed_command():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"horst-sparse": "horst_sparse.cli:main"}


@pytest.mark.parametrize(
    "argv0,typed",
    [
        ("/opt/venv/bin/horst-sparse", "horst-sparse plan train_vit.py"),
        (str(ROOT / "horst_sparse" / "cli.py"), "python -m horst_sparse.cli plan train_vit.py"),  # python -m
        ("/usr/bin/pytest", "horst-sparse plan train_vit.py"),  # a command's main called from code
    ],
)
def test_a_command_is_named_as_it_was_typed(argv0, typed, monkeypatch):
    monkeypatch.setattr(sys, "argv", [argv0, "plan", "train_vit.py"])
    assert cli.typed("plan", ["train_vit.py"]) == typed
