"""Packaging: ``pip install .`` is horst and pruning with torch as their only dependency (a
wheel built from this tree, installed into a fresh venv that can see torch and nothing else,
takes a HORST step); ``'.[pipelines]'`` adds what the pipelines need; requirements.lock pins
both lists, and the Dockerfile and environment.yml install exactly that lock."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_the_libraries_depend_on_torch_alone():
    assert PROJECT["dependencies"] == ["torch>=2.4"]
    assert "torch" not in {Requirement(spec).name for spec in PROJECT["optional-dependencies"]["pipelines"]}


def test_the_lock_pins_every_dependency_within_its_range():
    pins = lock_pins()
    for spec in PROJECT["dependencies"] + PROJECT["optional-dependencies"]["pipelines"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in requirements.lock: regenerate it (the command is in its header)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            name,
            pins[name],
            str(requirement.specifier),
        )


def test_the_lock_keeps_the_torch_pins_of_the_constraints_file():
    pins = lock_pins()
    constraints = (ROOT / "constraints.txt").read_text()
    assert "torch==2.14.1" in constraints and "torchvision==0.29.1" in constraints
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"


def test_environment_yml_and_the_dockerfile_install_the_lock():
    spec = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    pip = next(d["pip"] for d in spec if isinstance(d, dict))
    assert "python=3.11" in spec and pip == ["-r requirements.lock"]
    docker = (ROOT / "Dockerfile").read_text()
    for lock in ("requirements.lock", "requirements-no-torch.lock"):
        assert re.search(rf"^COPY {lock} (\S+)$", docker, re.M)
    # the install itself: tests/test_dockerfile.py expands it as the image's shell does


def test_environment_yml_names_the_install_for_an_older_driver():
    """Its comment's pip section for a driver older than CUDA 13's, uncommented, is the
    constraints' torch and torchvision built for CUDA 12.6 and the lock without torch."""
    text = (ROOT / "environment.yml").read_text()
    lines = re.findall(r"^#\s+(- .*)$", text, re.M)
    assert yaml.safe_load("\n".join(lines)) == [
        "--extra-index-url https://download.pytorch.org/whl/cu126",
        *[
            f"{pin}+cu126"
            for pin in re.findall(r"^torch(?:vision)?==\S+", (ROOT / "constraints.txt").read_text(), re.M)
        ],
        "-r requirements-no-torch.lock",
    ]
    assert "make venv TORCH=cu126" in text


def test_make_installs_the_pipelines_and_the_dev_tools():
    assert "-e '.[dev,pipelines]'" in (ROOT / "Makefile").read_text()


# ------------------------------------------------------------------------------ the torch-only wheel


def torch_and_its_requirements() -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions torch needs on this platform, torch included (extras followed)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    pending = [("torch", frozenset())]
    while pending:
        name, extras = pending.pop()
        distribution = importlib.metadata.distribution(name)
        key = canonicalize_name(distribution.metadata["Name"])
        if key in found and not extras:
            continue
        found[key] = distribution
        for spec in distribution.requires or []:
            requirement = Requirement(spec)
            if requirement.marker is None or any(requirement.marker.evaluate({"extra": e}) for e in {"", *extras}):
                pending.append((requirement.name, frozenset(requirement.extras)))
    return found


def expose(distributions: dict[str, importlib.metadata.Distribution], folder: Path) -> None:
    """Links the top-level files and folders of these distributions (their code and metadata)
    from the shared site-packages into ``folder``."""
    folder.mkdir()
    for distribution in distributions.values():
        site = Path(distribution.locate_file(""))
        for file in distribution.files or []:
            top = file.parts[0]
            if top != ".." and not (folder / top).exists() and (site / top).exists():
                (folder / top).symlink_to(site / top)


WHEEL_CHECK = """
import importlib.metadata, importlib.util, json, sys
import torch
import horst, pruning
param = torch.nn.Parameter(torch.randn(8, 4))
param.grad = torch.randn(8, 4)
before = param.detach().clone()
horst.HORST([param], lr=1e-2, fused=True).step()
masks = pruning.magnitude_masks({"w": param.detach()}, 0.5)
print(json.dumps({
    "stepped": not torch.equal(param, before) and bool(torch.isfinite(param).all()),
    "pruned": int((~masks["w"]).sum()),
    "horst_file": horst.__file__,
    "top_level": sorted({p.parts[0].removesuffix(".py") for p in importlib.metadata.files("horst-sparse")
                         if p.parts[0] not in ("..",) and not p.parts[0].endswith(".dist-info")}),
    "distributions": sorted(d.metadata["Name"] for d in importlib.metadata.distributions()),
    "requires": importlib.metadata.requires("horst-sparse"),
    "others": [m for m in ("timm", "transformers", "hydra", "omegaconf", "wandb", "yaml", "numpy", "pytest")
               if importlib.util.find_spec(m) is not None],
}))
"""


def test_wheel_installs_with_torch_alone_and_takes_a_step(tmp_path):
    source = tmp_path / "source"  # a copy: the build writes build/ and *.egg-info next to the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    for package in ("horst", "pruning", "horst_sparse", "hydra_plugins"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp_path / "dist", source], check=True
    )
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    torch_only = tmp_path / "torch-only"
    requirements = torch_and_its_requirements()
    expose(requirements, torch_only)
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "torch-only.pth").write_text(f"{torch_only}\n")
    subprocess.run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], check=True)
    check = subprocess.run([*pip, "--python", python, "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr  # every declared dependency is there
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    result = subprocess.run([python, "-c", WHEEL_CHECK], capture_output=True, text=True, cwd=tmp_path, env=clean)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["stepped"] and seen["pruned"] == 16
    # no generic top-level name (training, analysis) lands in a user's site-packages: the project's
    # namespace, the two libraries, and Hydra's own namespace for its launcher plugin
    assert seen["top_level"] == ["horst", "horst_sparse", "hydra_plugins", "pruning"]
    assert Path(seen["horst_file"]).is_relative_to(site)  # the installed wheel, not this tree
    assert not seen["others"]  # nothing beyond torch's own requirements can be imported ...
    visible = {canonicalize_name(name) for name in seen["distributions"]}
    assert visible == set(requirements) | {"horst-sparse"}  # ... or is installed
    assert [r for r in seen["requires"] if "extra ==" not in r] == ["torch>=2.4"]
    assert sysconfig.get_path("purelib") not in site


# ------------------------------------------------------------------------------ torch for older drivers

CUDA_WHEELS = ("nvidia-", "cuda-")  # and triton: what torch's CUDA build brings


def lock_entries(name: str) -> dict[str, tuple[str, list[str]]]:
    """A lock's entries: name -> (version, the packages it is "via")."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in (ROOT / name).read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            package, version = line.split("==")
            current = canonicalize_name(package)
            entries[current] = (version.strip(), [])
        elif current and line.strip().startswith("#"):
            text = line.strip().lstrip("#").strip()
            via = text.removeprefix("via").strip()
            if via and not via.startswith("-r"):
                entries[current][1].append(canonicalize_name(via))
    return entries


def test_the_lock_without_torch_is_the_full_lock_less_torch_and_its_cuda_wheels():
    full, rest = lock_entries("requirements.lock"), lock_entries("requirements-no-torch.lock")
    left_out = set(full) - set(rest)
    assert left_out == {n for n in full if n in ("torch", "torchvision", "triton") or n.startswith(CUDA_WHEELS)}
    assert not set(rest) - set(full)
    assert {n: full[n][0] for n in rest} == {n: v for n, (v, _) in rest.items()}  # every other pin the same
    for name in left_out - {"torch", "torchvision"}:  # needed by nothing the other lock keeps
        assert set(full[name][1]) <= left_out, (name, full[name][1])
    assert {"sympy", "networkx", "jinja2", "filelock"} <= set(rest)  # torch's own pure-Python requirements stay pinned


def make_venv_lines(*variables: str) -> list[str]:
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "venv", "VENV=/tmp/never", *variables],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def test_make_venv_torch_cu126_takes_the_pinned_torch_built_for_cuda_12_6_and_the_rest_from_the_lock():
    lines = make_venv_lines("TORCH=cu126")
    (torch_line,) = [line for line in lines if "download.pytorch.org" in line]
    assert "--extra-index-url https://download.pytorch.org/whl/cu126 " in torch_line
    assert torch_line.endswith("-c requirements-no-torch.lock torch==2.14.1+cu126 torchvision==0.29.1+cu126")
    # then the project, its torch kept (2.14.1+cu126 is ==2.14.1) and everything else pinned by the lock
    assert lines[-2].endswith("-c constraints.txt -c requirements-no-torch.lock -e '.[dev,pipelines]'")
    assert lines.index(torch_line) < len(lines) - 2
    assert not any("--system-site-packages" in line for line in lines)


def test_make_venv_without_torch_keeps_the_default_install():
    lines = make_venv_lines()
    assert not any("download.pytorch.org" in line or "no-torch" in line for line in lines)
    assert lines[-2].endswith("-m pip install --quiet -c constraints.txt -e '.[dev,pipelines]'")


@pytest.mark.slow  # a real venv and a real install of every pinned package but torch (~3 min)
def test_make_venv_torch_site_installs_nothing_over_the_torch_the_interpreter_has(tmp_path):
    """`make venv TORCH=site` over an interpreter that has torch, run for real: a venv with
    --system-site-packages and the project with every pipeline package installed into it. The
    torch is this environment's, made visible through PYTHONPATH (as a module system does; the
    system's own site-packages is not written to here). The venv holds no torch, triton or CUDA
    wheel of its own, imports that torch, and the rest is at the lock's versions."""
    torch_only = tmp_path / "site"
    expose(torch_and_its_requirements(), torch_only)
    venv = tmp_path / "venv"
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV", "MAKEFLAGS")}
    environment["PYTHONPATH"] = str(torch_only)
    python = f"{sys.base_prefix}/bin/python3.11"
    done = subprocess.run(
        ["make", "venv", "TORCH=site", f"VENV={venv}", f"PYTHON={python}"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "include-system-site-packages = true" in (venv / "pyvenv.cfg").read_text()
    assert f"torch=={importlib.metadata.version('torch')}" in (venv / "site-torch.txt").read_text().split()
    check = "import json, torch, horst, timm; print(json.dumps([torch.__file__, horst.__file__]))"
    torch_file, horst_file = json.loads(
        subprocess.run(
            [venv / "bin" / "python", "-c", check], env=environment, capture_output=True, text=True, check=True
        ).stdout
    )
    assert Path(torch_file).is_relative_to(torch_only) and Path(horst_file).is_relative_to(ROOT)
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    listed = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "list", "--format", "json", "--path", site],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = {canonicalize_name(item["name"]): item["version"] for item in json.loads(listed)}
    assert "timm" in installed and "horst-sparse" in installed
    assert not {n for n in installed if n in ("torch", "triton") or n.startswith(CUDA_WHEELS)}
    rest = lock_entries("requirements-no-torch.lock")
    installed = {n: v for n, v in installed.items() if n not in ("pip", "setuptools")}  # the venv's own (ensurepip)
    assert {n: v for n, v in installed.items() if n in rest} == {n: rest[n][0] for n in installed if n in rest}
    # and the interpreter without torch: one line naming the fix, no venv left behind
    done = subprocess.run(
        ["make", "venv", "TORCH=site", f"VENV={tmp_path / 'bare'}", f"PYTHON={python}"],
        cwd=ROOT,
        env={**environment, "PYTHONPATH": ""},
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and not (tmp_path / "bare").exists()
    assert "make venv TORCH=site: " in done.stderr and "has no torch" in done.stderr
