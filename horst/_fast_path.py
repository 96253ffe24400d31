"""The fast path: ``adamw_mirror_tensor_`` compiled by ``torch.compile`` into one kernel.

Inductor turns the whole AdamW + mirror update into a single pass over the parameter, its
gradient and the two moments (C++/OpenMP on CPU, Triton on CUDA), which is what the fused
``torch.optim.AdamW`` does by hand. Each tensor is passed flattened and sizes are dynamic,
so one compilation serves every parameter of a run (one more per dtype and per order).

Set ``HORST_FUSED=0`` (or pass ``fused=False``) for the plain eager path: same function,
no compilation, slower steps.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
from torch import Tensor

from horst.functional import adamw_mirror_tensor_

_compile_failed = False


def use_fast_path(fused: bool | None) -> bool:
    """``fused`` if given, else the ``HORST_FUSED`` environment switch (default on)."""
    if fused is not None:
        return fused
    return os.environ.get("HORST_FUSED", "1").strip().lower() not in ("0", "false", "no", "off")


@functools.cache
def _compiled_kernel():
    return torch.compile(adamw_mirror_tensor_, dynamic=True, fullgraph=True)


def adamw_mirror_(
    param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, scalars: Tensor,
    *, mirror_first: bool, fast: bool,
) -> None:  # fmt: skip
    """Run ``adamw_mirror_tensor_`` on the fast path if asked for and available."""
    global _compile_failed
    if fast and not _compile_failed:
        tensors = (param, grad, exp_avg, exp_avg_sq)
        if all(t.is_contiguous() for t in tensors):
            tensors = tuple(t.view(-1) for t in tensors)
        try:
            _compiled_kernel()(*tensors, scalars, mirror_first)
            return
        except Exception as error:  # noqa: BLE001 - any compiler failure: fall back, loudly
            _compile_failed = True
            warnings.warn(
                f"horst: torch.compile fast path failed ({type(error).__name__}: {error}); "
                "using the plain path from now on (set HORST_FUSED=0 to skip the attempt)",
                RuntimeWarning,
                stacklevel=3,
            )
    adamw_mirror_tensor_(param, grad, exp_avg, exp_avg_sq, scalars, mirror_first)
