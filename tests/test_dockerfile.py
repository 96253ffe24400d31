"""The Dockerfile against requirements.lock (no Docker engine here to build it): its base brings
no CUDA other than the wheels' (or the same major), its Python is the lock's, the compiled
paths find a C compiler and Python's headers, and the driver the wheels' CUDA needs is stated
where a cluster's admin reads it."""

from __future__ import annotations

import re
import subprocess

from conftest import ROOT

from horst_sparse.training.env import MIN_DRIVER

DOCKERFILE = (ROOT / "Dockerfile").read_text()
LOCK = (ROOT / "requirements.lock").read_text()
BASE = re.search(r"^FROM (\S+)", DOCKERFILE, re.M).group(1)
INSTALLED = set(" ".join(re.findall(r"apt-get install ([^&\n]*)", DOCKERFILE)).split())


def lock_cuda_major() -> int:
    """The CUDA major of the wheels torch loads (nvidia-cuda-runtime, the cuNN-suffixed ones alike)."""
    runtime = int(re.search(r"^nvidia-cuda-runtime(?:-cu\d+)?==(\d+)\.", LOCK, re.M).group(1))
    suffixes = {int(major) for major in re.findall(r"^nvidia-[\w-]+-cu(\d+)==", LOCK, re.M)}
    assert suffixes <= {runtime}, f"the lock mixes CUDA majors: {suffixes | {runtime}}"
    return runtime


def test_the_base_image_brings_no_other_cuda_than_the_wheels():
    major = lock_cuda_major()
    if cuda := re.match(r"nvidia/cuda:(\d+)\.", BASE):
        assert int(cuda.group(1)) == major, f"{BASE} beside the lock's CUDA {major} wheels"
    else:
        assert "cuda" not in BASE.lower()


def test_the_image_runs_the_locks_python_with_a_c_compiler_and_pythons_headers():
    version = re.search(r"--python-version (\d+\.\d+)", LOCK).group(1)
    official = re.match(rf"python:{re.escape(version)}\b", BASE)  # the official image ships the headers
    assert official or f"python{version}-dev" in INSTALLED, f"{BASE}: no Python {version} headers"
    assert INSTALLED & {"gcc", "clang", "build-essential"}, "no C compiler: Triton builds its launcher with one"
    assert "libc6-dev" in INSTALLED or "build-essential" in INSTALLED, "no C library headers"


def test_the_driver_the_wheels_need_is_stated_beside_the_image():
    need = MIN_DRIVER[lock_cuda_major()]
    assert f">= {need}" in DOCKERFILE
    assert f"driver >= {need}" in (ROOT / "README.md").read_text()


def pip_install_line(torch: str) -> list[str]:
    """The image's pip install as its shell (/bin/sh, as docker's RUN) expands it for a TORCH build arg."""
    run = re.search(r"^RUN (pip install -r .*?)(?<!\\)$", DOCKERFILE, re.M | re.S).group(1).replace("\\\n", " ")
    done = subprocess.run(
        ["/bin/sh", "-c", f'set -- {run}; printf "%s\\n" "$@"'],
        env={"TORCH": torch},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def test_the_image_installs_the_lock_or_torch_for_an_older_driver_beside_the_rest_of_it():
    assert re.search(r"^ARG TORCH=$", DOCKERFILE, re.M)
    assert pip_install_line("") == ["pip", "install", "-r", "/workspace/requirements.lock"]
    pins = re.findall(r"^torch(?:vision)?==\S+", (ROOT / "constraints.txt").read_text(), re.M)
    assert pip_install_line("cu126") == [
        "pip", "install", "-r", "/workspace/requirements-no-torch.lock",
        "--extra-index-url", "https://download.pytorch.org/whl/cu126", *[f"{pin}+cu126" for pin in pins],
    ]  # fmt: skip
    assert "docker build --build-arg TORCH=cu126" in DOCKERFILE


def test_the_documented_run_line_gives_the_workers_shared_memory_and_locked_pages():
    """Docker's /dev/shm is 64 MB: DataLoader workers and NCCL need the host's (or a larger one)."""
    for text in (DOCKERFILE, (ROOT / "README.md").read_text()):
        (line,) = re.findall(r"docker run [^\n`]*", text)
        assert "--ipc=host" in line or "--shm-size" in line, line
        assert "--ulimit memlock=-1" in line and "--gpus all" in line
