"""pyproject.toml, environment.yml and the Dockerfile install the same packages."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"^\s*([A-Za-z0-9_.\-]+)")


def names(requirements):
    return {NAME.match(r).group(1).lower().replace("_", "-") for r in requirements}


def pyproject_packages():
    return names(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def environment_packages():
    spec = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    conda = [d for d in spec if isinstance(d, str)]
    pip = next(d["pip"] for d in spec if isinstance(d, dict))
    # python/pip are the environment itself; pytest is the dev extra
    return names(conda + pip) - {"python", "pip", "pytest"}


def dockerfile_packages():
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    install = next(line for line in text.splitlines() if line.startswith("RUN pip install") and '"' in line)
    return names(re.findall(r'"([^"]+)"', install))


def test_environment_yml_matches_pyproject():
    assert environment_packages() == pyproject_packages()


def test_dockerfile_matches_pyproject():
    assert dockerfile_packages() == pyproject_packages()


def test_torch_pins_are_in_the_constraints_file():
    pins = (ROOT / "constraints.txt").read_text()
    assert "torch==2.14.1" in pins and "torchvision==0.29.1" in pins
