"""Seeding, determinism, device and autocast precision for a training run."""

from __future__ import annotations

import contextlib
import os
import random

import numpy as np
import torch


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


def seed_rngs(seed: int) -> None:
    """Seed python's, numpy's and torch's (every device's) random number generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def select_device(name: str = "auto", *, local_rank: int = 0) -> torch.device:
    """`auto` picks the local rank's GPU when CUDA is available, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device=cuda was requested but CUDA is not available; use device=cpu or device=auto")
        device = torch.device("cuda", local_rank)
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


# Dense bf16 tensor-core peaks (TFLOP/s) by GPU name, for model FLOPs utilisation.
_PEAK_BF16_TFLOPS = {
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "A6000": 155.0,
    "A10": 125.0,
    "4090": 165.0,
}


def peak_flops(device: torch.device, configured_tflops: float | None = None) -> float | None:
    """Peak FLOP/s of one device for MFU: the configured value, else a lookup by CUDA device
    name; None on the CPU or for an unknown GPU (MFU is then not reported)."""
    if configured_tflops:
        return configured_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    # First match wins, so more specific names come first in the table.
    return next((tflops * 1e12 for key, tflops in _PEAK_BF16_TFLOPS.items() if key in name), None)
