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
    assert re.search(r"^COPY requirements.lock (\S+)$", docker, re.M)
    assert re.search(r"^RUN pip install -r \S*requirements.lock$", docker, re.M)


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
