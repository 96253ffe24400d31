"""Seeding, determinism, device and autocast precision for a training run."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sysconfig
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from horst_sparse.training.config import RunError


def seed_everything(seed: int, *, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all devices); optionally make kernels deterministic.

    Determinism costs speed on CUDA (cuBLAS workspace config, no non-deterministic
    kernels), so it is a switch; CPU runs here are deterministic either way.
    """
    seed_rngs(seed)
    if deterministic:
        # Must be set before the first cuBLAS call to take effect.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def seed_rngs(seed: int, *, cpu_only: bool = False) -> None:
    """Seed python's, numpy's and torch's (every device's) random number generators; `cpu_only`:
    torch's CPU generator alone, the only one a CPU run draws from (`torch.manual_seed` also
    queues a seed for every CUDA device, with a stack trace, even where CUDA never starts)."""
    random.seed(seed)
    np.random.seed(seed)
    if cpu_only:
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


# The oldest Linux driver that runs each CUDA major (NVIDIA's CUDA toolkit release notes: 13.0 GA
# needs 580.65.06, any 12.x 525.60.13 by minor-version compatibility). The pinned torch is a CUDA 13.0
# build (requirements.lock); the Dockerfile and the README state its line (tests/test_dockerfile.py).
MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}
# The install for a driver older than the pinned torch's CUDA: the same torch built for CUDA 12.6
# (the Makefile's TORCH), everything else as locked.
OLD_DRIVER_INSTALL = "make venv TORCH=cu126"


def nvidia_driver() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it (e.g. 550.54.15); None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = smi.stdout.split()
    return lines[0] if smi.returncode == 0 and lines else None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def cuda_problem() -> str | None:
    """Why this process cannot use CUDA, as one sentence naming the driver, torch's CUDA and the
    fix; None where it can."""
    with warnings.catch_warnings():  # torch's "driver too old" warning: the sentence below says it
        warnings.simplefilter("ignore")
        if torch.cuda.is_available():
            return None
    cpu_fix = "or train on the CPU with device=cpu (device=auto picks it)"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build; install requirements.lock's CUDA build, {cpu_fix}"
    need = MIN_DRIVER.get(int(torch.version.cuda.split(".")[0]))
    built = f"torch {torch.__version__} is built for CUDA {torch.version.cuda}" + (
        f" (NVIDIA driver >= {need})" if need else ""
    )
    driver = nvidia_driver()
    if driver is None:
        return f"no NVIDIA driver answers here (nvidia-smi); {built}; run on a GPU node, {cpu_fix}"
    if need and _version(driver) < _version(need):
        fix = "update the driver"
        if need != MIN_DRIVER[12] and _version(driver) >= _version(MIN_DRIVER[12]):
            fix = f"install torch's CUDA 12.6 build ({OLD_DRIVER_INSTALL}), {fix}"
        return f"NVIDIA driver {driver} is too old: {built}; {fix}, {cpu_fix}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (
        f"CUDA sees no GPU (NVIDIA driver {driver}, CUDA_VISIBLE_DEVICES={visible!r}; {built}); "
        f"check the job's GPU request, {cpu_fix}"
    )


def python_headers() -> Path:
    """Where Python.h must be for this interpreter (what Triton and Inductor compile against)."""
    return Path(sysconfig.get_paths()["include"]) / "Python.h"


def compile_problem(device_type: str) -> str | None:
    """Why torch.compile cannot build kernels for `device_type` here, as one sentence naming the
    fix; None where it can. Inductor compiles CPU kernels with a C++ compiler (its own search:
    $CXX, else g++), and Triton builds its CUDA launchers with a C compiler ($CC, else gcc or
    clang, as triton.runtime.build looks); both build Python extension modules, against Python's
    headers (sysconfig's include path). Without either the first step fails deep in them."""
    if not python_headers().is_file():
        return (
            f"torch.compile needs Python's headers and {python_headers()} is missing; install them "
            f"(apt install python{sysconfig.get_python_version()}-dev) or use compile=false"
        )
    if device_type == "cuda":
        found = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
        needed = "a C compiler for Triton ($CC, gcc or clang)"
    else:
        from torch._inductor import config

        # Inductor's candidates ($CXX when torch was imported, else g++); its own search caches
        # its first answer for the process, so it is looked up here as it looks.
        found = next(filter(None, (shutil.which(c) for c in config.cpp.cxx if c)), None)
        needed = "a C++ compiler for Inductor's CPU kernels ($CXX or g++)"
    if found:
        return None
    return f"torch.compile needs {needed} and none is on the PATH; install one (apt install g++) or use compile=false"


def cuda_device(local_rank: int) -> torch.device:
    """The local rank's GPU. Where SLURM binds each task its own GPU (--gpus-per-task,
    --gpu-bind), every task sees only that one, as cuda:0: hence modulo the visible count."""
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def select_device(name: str = "auto", *, local_rank: int = 0) -> torch.device:
    """`auto` picks the local rank's GPU when CUDA works, else the CPU; `cuda` where CUDA does
    not work stops at once with a one-line `RunError` saying why (`cuda_problem`)."""
    if name == "auto":
        name = device_type(name)
    if name == "cuda":
        if problem := cuda_problem():
            raise RunError(f"device=cuda, but {problem}")
        device = cuda_device(local_rank)
        torch.cuda.set_device(device)
        return device
    if name == "cpu":
        return torch.device("cpu")
    raise ValueError(f"unknown device {name!r}; use auto, cpu or cuda")


# fp16 would need a GradScaler; bf16 does not, and every GPU this targets has it.
_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype:
    """`auto` means bf16 autocast on CUDA (weights stay fp32) and plain fp32 on the CPU."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if precision not in _DTYPES:
        raise ValueError(f"unknown precision {precision!r}; use auto, bf16 or fp32")
    return _DTYPES[precision]


def autocast(device: torch.device, dtype: torch.dtype):
    """Autocast context for the forward pass; a no-op for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def device_type(name: str) -> str:
    """`cpu` or `cuda` for a configured device name (before any device is set up)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


SHARED_MEMORY = Path("/dev/shm")


def image_batch_bytes(batch_size: int, channels: int, img_size: int | Sequence[int]) -> int:
    """The bytes of one batch of float32 images (``img_size``: n, square, or (height, width)), as a
    DataLoader worker hands it over."""
    height, width = (img_size, img_size) if isinstance(img_size, int) else img_size
    return batch_size * channels * height * width * 4


def shared_memory_problem(
    batch_bytes: int, *, workers: int, prefetch: int, processes: int = 1, path: Path = SHARED_MEMORY
) -> str | None:
    """Why DataLoader workers cannot hand their batches over here, as one sentence naming the
    fix; None where they can (or with no workers, or no `path`). Workers pass each batch
    through shared memory (`path`, a tmpfs): `processes` x `workers` x `prefetch` batches of
    `batch_bytes` at once. Docker gives a container 64 MB there; a batch that does not fit
    kills the first step with a bus error."""
    if workers == 0:
        return None
    try:
        free = shutil.disk_usage(path).free
    except OSError:  # no /dev/shm (not Linux): torch uses its own file-descriptor scheme
        return None
    need = processes * workers * prefetch * batch_bytes
    if need <= free:
        return None
    mib = 2**20
    return (
        f"{processes * workers} DataLoader workers hold {prefetch} batches of {batch_bytes / mib:.0f} MiB each in "
        f"{path} ({need / mib:.0f} MiB), which has {free / mib:.0f} MiB free; in Docker run with --ipc=host "
        "(or --shm-size) and --ulimit memlock=-1, else lower data.num_workers or the batch size"
    )
