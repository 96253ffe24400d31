"""The fast path: one fused pass per tensor instead of a chain of elementwise ops.

* Dense float32 tensors on CPU: ``horst._cpu_kernel``, a C kernel called once per batch of
  tensors that share the step's scalars (``torch.compile``'s CPU code was ~2x
  ``torch.optim.AdamW(fused=True)`` per tensor, plus ~0.2 ms of call overhead per tensor).
* Other dense tensors (CUDA, bf16): ``horst.functional.mirror_step_`` compiled by
  ``torch.compile`` into one kernel (Triton on CUDA). Each tensor is passed as a 1-D alias and
  sizes are dynamic, so one compilation serves every parameter of a run (one more per base,
  dtype, order and guard).
* Tensors without a dense layout shared by the parameter, its gradient and its state: the
  plain path.

Every optimizer of ``horst`` (every base: AdamW, Lion, SGD) takes these paths. Set
``HORST_FUSED=0`` (or pass ``fused=False``) for the plain eager path: the same function as the
compiled one, no compilation, slower steps. A fast path that fails to build warns once and
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
from horst.functional import Descend, Scalars, compute_dtype, mirror_step_, pack

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


def _mirror_step_packed_(
    descend: Descend, param: Tensor, grad: Tensor, state: tuple[Tensor, ...], packed: Tensor, order: str, guard: bool
) -> None:
    mirror_step_(descend, param, grad, state, Scalars(*packed.unbind()), order, guard)


# one graph per base, order, guard and dtype: more than dynamo's default limit of 8 per function
RECOMPILE_LIMIT = 64


@functools.cache
def _compiled_kernel():
    compiled = torch.compile(_mirror_step_packed_, dynamic=True, fullgraph=True)

    def call(*args):
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            return compiled(*args)

    return call


PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def dense_layout(tensors: Sequence[Tensor]) -> bool:
    """Whether the tensors are plain tensors sharing one dense memory layout: contiguous,
    channels_last or any other permutation of the dimensions. Only those take a fast path: an
    elementwise update can then run over their memory in storage order. A tensor subclass (a
    DTensor whose layout differs from its gradient's, see ``horst.optimizer.local_shards``)
    has no memory of its own to run over (its ``data_ptr()`` is 0, its shape is the global one)."""
    if any(type(t) not in PLAIN_TENSOR_TYPES for t in tensors):
        return False
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


def kernel_mode(s: Scalars, order: str, guard: bool) -> int | None:
    """The C kernel's mirror mode for these scalars, or None if it has none (a pull by both
    the update and the gradient, or a guard without HAM's pull: no optimizer here asks for them)."""
    if s.alpha_u == 0 and s.alpha_g == 0 and s.lr_beta == 0 and not guard:
        return _cpu_kernel.MODE_NO_MIRROR
    if order == "sm":
        return _cpu_kernel.MODE_SM if s.alpha_g == 0 and not guard else None
    if s.alpha_g == 0 and not guard:
        return _cpu_kernel.MODE_MS_UPDATE
    if s.alpha_u == 0:
        return _cpu_kernel.MODE_MS_GRADIENT_GUARDED if guard else _cpu_kernel.MODE_MS_GRADIENT
    return None


def mirror_step_foreach_(
    descend: Descend,
    kernel_base: int,
    tensors: Sequence[tuple[Tensor, ...]],
    s: Scalars,
    *,
    order: str,
    guard: bool,
    fast: bool,
    sums_of_squares: bool = False,
) -> list[float | None]:
    """One step over ``(param, grad, *state)`` tuples that share the step's scalars ``s``:
    ``descend`` (a base's, with ``kernel_base`` its base in the C kernel) composed with the
    mirror step, on the fast path if ``fast``, else on the plain path. With ``sums_of_squares``
    the C kernel also sums the squares of each new parameter it computes (HAM's norm cap):
    returned per tuple, None for the tuples another path stepped."""
    for_kernel, for_compiler, for_plain = [], [], []
    mode = kernel_mode(s, order, guard)
    for index, group in enumerate(tensors):
        if not (fast and dense_layout(group)):
            for_plain.append(index)
        elif mode is not None and _cpu_kernel.supports(group):
            for_kernel.append(index)
        else:
            for_compiler.append(index)
    sums: list[float | None] = [None] * len(tensors)
    if for_kernel:
        kernel_sums = _cpu_kernel_step([tensors[i] for i in for_kernel], s, kernel_base, mode, sums_of_squares)
        if kernel_sums is False:
            for_compiler += for_kernel
        elif kernel_sums is not None:
            for index, total in zip(for_kernel, kernel_sums):
                sums[index] = total
    packed = _PackedByDevice(s)
    for position, index in enumerate(for_compiler):
        if not _compiled_step(descend, flat_aliases(tensors[index]), packed, order, guard):
            for_plain += for_compiler[position:]
            break
    for index in for_plain:
        param, grad, *state = tensors[index]
        mirror_step_(descend, param, grad, tuple(state), s, order, guard)
    return sums


class _PackedByDevice(dict):
    """The step's packed scalars on each device and in each compute dtype that asks for them,
    made once per step."""

    def __init__(self, values: Scalars) -> None:
        super().__init__()
        self.values = values

    def __missing__(self, key: tuple[torch.device, torch.dtype]) -> Tensor:
        self[key] = pack(self.values, *key)
        return self[key]


def _cpu_kernel_step(
    tensors: list[tuple[Tensor, ...]], s: Scalars, base: int, mode: int, sums_of_squares: bool
) -> list[float] | None | bool:
    """The C kernel over all ``tensors`` in one call: the new parameters' sums of squares if
    asked for, else None; False if the kernel is not available."""
    if "C kernel" in _failed:
        return False
    try:
        return _cpu_kernel.mirror_step_f32_(tensors, tuple(s), base=base, mode=mode, sums_of_squares=sums_of_squares)
    except (_cpu_kernel.KernelBuildError, OSError) as error:
        _give_up("C kernel", error, "compiled path (torch.compile)")
        return False


def _compiled_step(
    descend: Descend, tensors: tuple[Tensor, ...], packed: _PackedByDevice, order: str, guard: bool
) -> bool:
    """The compiled kernel on one tensor's 1-D aliases; False if it is not available."""
    if "torch.compile" in _failed:
        return False
    param, grad, *state = tensors
    try:
        _compiled_kernel()(
            descend, param, grad, tuple(state), packed[param.device, compute_dtype(param.dtype)], order, guard
        )
    except Exception as error:  # noqa: BLE001 - any compiler failure: fall back, loudly
        _give_up("torch.compile", error, "plain path")
        return False
    return True
