"""The CPU fast path: ``_cpu_kernel.c`` compiled once per machine and called through ctypes.

``torch.compile`` of ``adamw_mirror_tensor_`` is correct on CPU but slow there: with dynamic
shapes its kernel takes ~2x the time of ``torch.optim.AdamW(fused=True)``, and each call
costs ~0.2 ms of guards and wrappers, 30 ms a step for GPT-2's 148 tensors. This kernel
does the same update in one vectorised pass per tensor and one call per param group
(``bench/optimizer_step.py``). It serves float32 CPU tensors in a dense layout (contiguous,
channels_last, ...); everything else (CUDA, bf16) takes the compiled path.

The shared library is built with the system C compiler (``$CC``, else ``cc``; the compiler
inductor needs on CPU anyway) into ``$HORST_CACHE_DIR`` (default ``~/.cache/horst``), named
by a hash of the source, the flags and the compiler, so that a changed source or another
CPU type (a shared home directory on a cluster) never loads a stale or foreign build.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from horst.mirror import EXP_ARG_MAX, EXP_ARG_MIN

SOURCE = Path(__file__).with_name("_cpu_kernel.c")
# vectorisation flags for the ISA torch's own CPU kernels use on this machine
ISA_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mavx2", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}
BLOCK = 1 << 15  # elements per unit of work of a thread (128 KiB of each stream)
# -funroll-loops: 7 % faster with one thread (interleaves the division and square-root chains)
BASE_FLAGS = ["-O3", "-funroll-loops", "-fno-math-errno", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC"]


class KernelBuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    if "HORST_CACHE_DIR" in os.environ:
        return Path(os.environ["HORST_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "horst"


def _compiler() -> str:
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise KernelBuildError(f"no C compiler {compiler!r} on PATH (set CC)")
    return compiler


def _flags() -> list[str]:
    return BASE_FLAGS + ISA_FLAGS.get(torch.backends.cpu.get_cpu_capability(), [])


def build() -> Path:
    """The path of the compiled kernel, compiling it first if this machine has no build."""
    compiler = _compiler()
    flags = _flags()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), *flags, version]).encode()).hexdigest()[:16]
    library = cache_dir() / f"horst_cpu_kernel_{key}.so"
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    # build next to the target and rename: concurrent processes (DDP ranks) never see half a file
    with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
        partial = Path(tmp) / library.name
        result = subprocess.run(
            [compiler, *flags, str(SOURCE), "-o", str(partial)], capture_output=True, text=True
        )
        if result.returncode != 0:
            raise KernelBuildError(f"{compiler} failed on {SOURCE.name}:\n{result.stderr.strip()}")
        os.replace(partial, library)
    return library


@functools.cache
def _kernel() -> ctypes.CDLL:
    library = ctypes.CDLL(str(build()))
    function = library.horst_adamw_mirror_f32
    pointers = ctypes.POINTER(ctypes.c_void_p)
    function.argtypes = [
        ctypes.c_int64, pointers, pointers, pointers, pointers, ctypes.POINTER(ctypes.c_int64),
        ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_float), ctypes.c_int, ctypes.c_int,
    ]  # fmt: skip
    function.restype = None
    return function


def supports(tensors: tuple[Tensor, ...]) -> bool:
    """Whether the kernel can update these (param, grad, exp_avg, exp_avg_sq), given that they
    share a dense layout (``horst._fast_path.dense_layout``): the kernel walks their memory
    from ``data_ptr()`` on, in storage order."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)


def kernel_scalars(values: dict[str, float]) -> list[float]:
    """The kernel's scalars (the enum of ``_cpu_kernel.c``, in its order) from the step's
    ``values`` (``horst.functional.adamw_mirror_values``)."""
    bias_correction2_sqrt = values["bias_correction2_sqrt"]
    return [
        values["one_minus_beta1"],
        values["beta2"],
        values["one_minus_beta2"],
        values["decay"],
        values["neg_step_size"] * bias_correction2_sqrt,  # one division per element, not two
        values["eps"] * bias_correction2_sqrt,
        values["alpha_u"],
        values["alpha_g"],
        values["lr_beta"],
        max(-values["clip"], EXP_ARG_MIN),  # HAM's clip and exp's float32 range in one clamp
        min(values["clip"], EXP_ARG_MAX),
    ]


def adamw_mirror_f32_(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    values: dict[str, float],
    *,
    mirror_first: bool,
) -> None:
    """One AdamW + mirror step over dense float32 CPU tensors (``supports``), one call."""
    count = len(params)
    arrays = [(ctypes.c_void_p * count)(*(t.data_ptr() for t in ts)) for ts in (params, grads, exp_avgs, exp_avg_sqs)]
    sizes = [t.numel() for t in params]
    block_starts = [0]
    for size in sizes:  # empty tensors take no block
        block_starts.append(block_starts[-1] + -(-size // BLOCK))
    scalars = kernel_scalars(values)
    _kernel()(
        count, *arrays, (ctypes.c_int64 * count)(*sizes), BLOCK, (ctypes.c_int64 * (count + 1))(*block_starts),
        (ctypes.c_float * len(scalars))(*scalars), int(mirror_first), torch.get_num_threads(),
    )  # fmt: skip
