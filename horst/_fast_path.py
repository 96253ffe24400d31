"""The fast path: one fused pass per tensor instead of a chain of elementwise ops.

* Dense float32 tensors on CPU: ``horst._cpu_kernel``, a C kernel called once per param group
  (``torch.compile``'s CPU code was ~2x ``torch.optim.AdamW(fused=True)`` per tensor, plus
  ~0.2 ms of call overhead per tensor).
* Other dense tensors (CUDA, bf16): ``adamw_mirror_tensor_`` compiled by ``torch.compile`` into
  one kernel (Triton on CUDA). Each tensor is passed as a 1-D alias and sizes are dynamic, so
  one compilation serves every parameter of a run (one more per dtype and per order).
* Tensors without a dense layout shared by all four (param, grad, moments): the plain path.

Set ``HORST_FUSED=0`` (or pass ``fused=False``) for the plain eager path: the same function as
the compiled one, no compilation, slower steps. A fast path that fails to build warns once and
hands over to the next (C kernel -> compiled -> plain).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from horst import _cpu_kernel
from horst.functional import adamw_mirror_scalars, adamw_mirror_tensor_

_failed: set[str] = set()  # fast paths that failed once in this process


def use_fast_path(fused: bool | None) -> bool:
    """``fused`` if given, else the ``HORST_FUSED`` environment switch (default on)."""
    if fused is not None:
        return fused
    return os.environ.get("HORST_FUSED", "1").strip().lower() not in ("0", "false", "no", "off")


def _give_up(path: str, error: Exception, fallback: str) -> None:
    _failed.add(path)
    warnings.warn(
        f"horst: the {path} fast path failed ({type(error).__name__}: {error}); using the {fallback} "
        "from now on (set HORST_FUSED=0 to skip the attempt)",
        RuntimeWarning,
        stacklevel=4,
    )


@functools.cache
def _compiled_kernel():
    return torch.compile(adamw_mirror_tensor_, dynamic=True, fullgraph=True)


def dense_layout(tensors: Sequence[Tensor]) -> bool:
    """Whether the tensors share one dense memory layout: contiguous, channels_last or any
    other permutation of the dimensions. Only those take a fast path: an elementwise update
    can then run over their memory in storage order."""
    first = tensors[0]
    if any(t.shape != first.shape or t.stride() != first.stride() for t in tensors[1:]):
        return False
    if first.is_contiguous():
        return True
    memory_order = sorted(range(first.ndim), key=lambda dim: -first.stride(dim))
    return first.permute(memory_order).is_contiguous()


def flat_aliases(tensors: Sequence[Tensor]) -> tuple[Tensor, ...]:
    """1-D tensors over the memory of ``dense_layout`` tensors, in storage order: plain tensors,
    not views, because dynamo guards on a view's base and would compile again for every
    parameter shape."""
    return tuple(
        torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(), (t.numel(),), (1,))
        for t in tensors
    )


def adamw_mirror_foreach_(
    tensors: Sequence[tuple[Tensor, Tensor, Tensor, Tensor]],
    values: dict[str, float],
    *,
    mirror_first: bool,
    fast: bool,
) -> None:
    """One step over ``(param, grad, exp_avg, exp_avg_sq)`` tuples that share the step's
    scalars ``values`` (``horst.functional.adamw_mirror_values``)."""
    for_kernel, for_compiler, for_plain = [], [], []
    for group in tensors:
        if not (fast and dense_layout(group)):
            for_plain.append(group)
        elif _cpu_kernel.supports(group):
            for_kernel.append(group)
        else:
            for_compiler.append(group)
    if for_kernel and not _cpu_kernel_step(for_kernel, values, mirror_first):
        for_compiler += for_kernel
    scalars = _ScalarsByDevice(values)
    for index, group in enumerate(for_compiler):
        if not _compiled_step(flat_aliases(group), scalars, mirror_first):
            for_plain += for_compiler[index:]
            break
    for param, grad, exp_avg, exp_avg_sq in for_plain:
        adamw_mirror_tensor_(param, grad, exp_avg, exp_avg_sq, scalars[param.device], mirror_first)


class _ScalarsByDevice(dict):
    """The step's packed scalars on each device that asks for them, made once per step."""

    def __init__(self, values: dict[str, float]) -> None:
        super().__init__()
        self.values = values

    def __missing__(self, device: torch.device) -> Tensor:
        self[device] = adamw_mirror_scalars(self.values, device)
        return self[device]


def _cpu_kernel_step(tensors: list[tuple[Tensor, ...]], values: dict[str, float], mirror_first: bool) -> bool:
    """The C kernel over all ``tensors`` in one call; False if it is not available."""
    if "C kernel" in _failed:
        return False
    try:
        _cpu_kernel.adamw_mirror_f32_(*map(list, zip(*tensors)), values, mirror_first=mirror_first)
    except (_cpu_kernel.KernelBuildError, OSError) as error:
        _give_up("C kernel", error, "compiled path (torch.compile)")
        return False
    return True


def _compiled_step(tensors: tuple[Tensor, ...], scalars: _ScalarsByDevice, mirror_first: bool) -> bool:
    """The compiled kernel on one tensor's 1-D aliases; False if it is not available."""
    if "torch.compile" in _failed:
        return False
    try:
        _compiled_kernel()(*tensors, scalars[tensors[0].device], mirror_first)
    except Exception as error:  # noqa: BLE001 - any compiler failure: fall back, loudly
        _give_up("torch.compile", error, "plain path")
        return False
    return True
