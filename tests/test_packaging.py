"""requirements.lock pins every dependency of pyproject.toml, and the Dockerfile and
environment.yml install exactly that lock."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version.strip()
    return pins


def test_the_lock_pins_every_dependency_within_its_range():
    pins = lock_pins()
    for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(spec)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not in requirements.lock: regenerate it (the command is in its header)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (name, pins[name], str(requirement.specifier))


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
