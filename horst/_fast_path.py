"""The fast path: one fused pass per tensor instead of a chain of elementwise ops.

* Dense float32 tensors on CPU: ``horst._cpu_kernel``, a C kernel called once per batch of
  tensors that share the step's scalars (``torch.compile``'s CPU code was ~2x
  ``torch.optim.AdamW(fused=True)`` per tensor, plus ~0.2 ms of call overhead per tensor).
* Other dense tensors (CUDA, bf16): ``horst.functional.mirror_step_`` compiled by
  ``torch.compile`` into one kernel (Triton on CUDA). Tensors of fewer than ``FLAT_NUMEL``
  elements are grouped by device and dtype, as ``torch.optim``'s foreach implementations group
  them, and stepped in one call over flat copies, those that take the mirror step and those
  that do not together (docs/design.md §2.5); larger ones in one call each on their own
  memory, passed as 1-D aliases. Sizes are dynamic, so one compilation serves every call of a
  run (one more per base, dtype, order and guard).
* Tensors without a dense layout shared by the parameter, its gradient and its state (any
  layout for the small ones, which are copied), or of a tensor subclass: the plain path.

Every optimizer of ``horst`` (every base: AdamW, Lion, SGD) takes these paths. Set
``HORST_FUSED=0`` (or pass ``fused=False``) for the plain eager path: the same function as the
compiled one, no compilation, slower steps. A fast path that fails to build warns once and
hands over to the next (C kernel -> compiled -> plain).
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

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


def failed_fast_paths() -> list[str]:
    """The fast paths that failed in this process and were replaced by a slower one (a run
    records them: a silent fallback would make its step times incomparable)."""
    return sorted(_failed)


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
    *values, mirrored = packed.unbind()
    mirror_step_(descend, param, grad, state, Scalars(*values), order, guard, mirrored)


# one graph per base, order, guard and dtype: more than dynamo's default limit of 8 per function
RECOMPILE_LIMIT = 64


@functools.cache
def _compiled_kernel():
    # the limit is this function's own (not a dynamo.config.patch around every call: host time)
    return torch.compile(_mirror_step_packed_, dynamic=True, fullgraph=True, recompile_limit=RECOMPILE_LIMIT)


PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def dense_layout(tensors: Sequence[Tensor]) -> bool:
    """Whether the tensors are plain tensors sharing one dense memory layout: contiguous,
    channels_last or any other permutation of the dimensions. Only those take a fast path: an
    elementwise update can then run over their memory in storage order. A tensor subclass (a
    DTensor whose layout differs from its gradient's, see ``horst.optimizer.local_shards``)
    has no memory of its own to run over (its ``data_ptr()`` is 0, its shape is the global one)."""
    first = tensors[0]
    shape, stride = first.shape, first.stride()
    for t in tensors:  # a loop, not any(...): this runs for every tensor at every step
        if type(t) not in PLAIN_TENSOR_TYPES or t.shape != shape or t.stride() != stride:
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
    mirrored: Sequence[bool] | None = None,
    norm_cap: float | None = None,
    whole: Sequence[bool] | None = None,
    buffers: dict | None = None,
) -> list[bool]:
    """One step over ``(param, grad, *state)`` tuples that share the step's scalars ``s``:
    ``descend`` (a base's, with ``kernel_base`` its base in the C kernel) composed with the
    mirror step, on the fast path if ``fast``, else on the plain path. The tuples that
    ``mirrored`` marks False (default: none) take the base's step alone (the mirror's scalars
    at 0) and no ``guard``.

    ``norm_cap`` (HAM's): each new parameter of a tuple ``whole`` marks (default: all; a shard's
    norm is not its tensor's) whose L2 norm exceeds it is rescaled to it where the path can do
    it in its own pass: the C kernel sums the squares as it steps, a flat compiled call scales
    its flat copy before writing it back. Returns per tuple whether it was capped here.

    ``buffers``: a dict the caller keeps from step to step (an optimizer's), in which the
    compiled path keeps its flat copies of small tensors (``_compiled_flat_step``)."""
    n = len(tensors)
    mirrored = [True] * n if mirrored is None else mirrored
    whole = [True] * n if whole is None else whole
    off = s._replace(alpha_u=0.0, alpha_g=0.0, lr_beta=0.0, clip=math.inf)
    modes = (kernel_mode(off, order, False), kernel_mode(s, order, guard))  # by mirrored
    for_plain: list[int] = []
    for_kernel: tuple[list[int], list[int]] = ([], [])  # by mirrored
    small: dict[tuple[torch.device, torch.dtype, bool], list[int]] = defaultdict(list)  # by device, dtype, whole
    for_compiler: list[int] = []  # one call each

    def compiled_or_plain(index: int, group: tuple[Tensor, ...]) -> None:
        param = group[0]
        dtype = param.dtype
        for t in group:  # a loop, not all(...): this runs for every tensor at every step
            if t.dtype != dtype:
                break
        else:
            if param.ndim and param.numel() < FLAT_NUMEL:  # any strides: copied in logical order
                small[param.device, dtype, whole[index]].append(index)
                return
        (for_compiler if dense_layout(group) else for_plain).append(index)

    for index, group in enumerate(tensors):
        for t in group:
            if type(t) not in PLAIN_TENSOR_TYPES:
                for_plain.append(index)
                break
        else:
            param = group[0]
            if not fast:
                for_plain.append(index)
            elif (
                param.dtype == torch.float32
                and param.device.type == "cpu"
                and modes[mirrored[index]] is not None
                and dense_layout(group)
                and _cpu_kernel.supports(group)
            ):
                for_kernel[mirrored[index]].append(index)
            else:
                compiled_or_plain(index, group)
    capped = [False] * n
    for is_mirrored, positions in enumerate(for_kernel):
        if not positions:
            continue
        sums = _cpu_kernel_step(
            [tensors[i] for i in positions], (off, s)[is_mirrored], kernel_base, modes[is_mirrored], norm_cap
        )
        if sums is False:
            for p in positions:
                compiled_or_plain(p, tensors[p])
        elif sums is not None:
            for p, total in zip(positions, sums):
                if whole[p]:
                    _cap(tensors[p][0], total, norm_cap)
                    capped[p] = True
    if small or for_compiler:
        for_plain += _compiled_steps(
            descend, tensors, small, for_compiler, mirrored, _PackedByDevice(s), order, guard, norm_cap, capped, buffers
        )
    for index in for_plain:
        param, grad, *state = tensors[index]
        mirror_step_(descend, param, grad, tuple(state), (off, s)[mirrored[index]], order, guard and mirrored[index])
    return capped


def _cap(param: Tensor, sum_of_squares: float, norm_cap: float) -> None:
    norm = math.sqrt(sum_of_squares)
    if norm > norm_cap:
        param.mul_(norm_cap / norm)


class _PackedByDevice(dict):
    """The step's packed scalars on each device, in each compute dtype and with each count of
    mirrored elements that asks for them, made once per step."""

    def __init__(self, values: Scalars) -> None:
        super().__init__()
        self.values = values

    def __missing__(self, key: tuple[torch.device, torch.dtype, float]) -> Tensor:
        device, dtype, mirrored = key
        self[key] = pack(self.values, device, dtype, mirrored)
        return self[key]


def _cpu_kernel_step(
    tensors: list[tuple[Tensor, ...]], s: Scalars, base: int, mode: int, norm_cap: float | None
) -> list[float] | None | bool:
    """The C kernel over all ``tensors`` in one call: the new parameters' sums of squares if
    there is a ``norm_cap``, else None; False if the kernel is not available."""
    if "C kernel" in _failed:
        return False
    try:
        return _cpu_kernel.mirror_step_f32_(
            tensors, tuple(s), base=base, mode=mode, sums_of_squares=norm_cap is not None
        )
    except (_cpu_kernel.KernelBuildError, OSError) as error:
        _give_up("C kernel", error, "compiled path (torch.compile)")
        return False


# Tensors of fewer elements are stepped together from flat copies: for them the host's cost of
# a call outweighs copying their elements; larger ones are stepped in place, one call each.
FLAT_NUMEL = 1 << 16
# At most this many elements in one set of flat copies: bounds the copies' memory.
FLAT_BATCH_NUMEL = 1 << 22


def _compiled_steps(
    descend: Descend,
    tensors: Sequence[tuple[Tensor, ...]],
    small: dict[tuple[torch.device, torch.dtype, bool], list[int]],
    large: list[int],
    mirrored: Sequence[bool],
    packed: _PackedByDevice,
    order: str,
    guard: bool,
    norm_cap: float | None,
    capped: list[bool],
    buffers: dict | None,
) -> list[int]:
    """The compiled kernel over the ``(param, grad, *state)`` tuples at the positions of
    ``small`` (those of one device, dtype and ``whole`` flag; all tensors of a tuple in the
    parameter's dtype) and ``large`` (dense tensors): the positions it left to the plain path
    (those of the call that failed and of every call after it); sets ``capped``.

    Small tensors are stepped by one call on flat copies (``_compiled_flat_step``) per device
    and dtype, mirrored and not mirrored together, at most ``FLAT_BATCH_NUMEL`` elements at a
    time; large ones by one call each on their own memory."""
    calls: list[tuple[list[int], bool]] = []  # (positions stepped by one call, whether it may cap)
    for (_, _, whole), positions in small.items():
        # mirrored first (the kernel's mask is an index bound), then by shape: few runs of one shape
        positions = sorted(positions, key=lambda p: (not mirrored[p], tensors[p][0].shape))
        numel = FLAT_BATCH_NUMEL
        for p in positions:
            size = tensors[p][0].numel()
            if numel + size > FLAT_BATCH_NUMEL:
                calls.append(([], whole))
                numel = 0
            calls[-1][0].append(p)
            numel += size
    for number, (positions, whole) in enumerate(calls):
        cap = norm_cap if whole else None
        if not _compiled_flat_step(descend, tensors, positions, mirrored, packed, order, guard, cap, buffers):
            return [p for positions, _ in calls[number:] for p in positions] + large
        if cap is not None:
            for p in positions:
                capped[p] = True
    for number, p in enumerate(large):
        bound = math.inf if mirrored[p] else 0.0
        if not _compiled_step(descend, flat_aliases(tensors[p]), packed, order, guard, bound):
            return large[number:]
    return []


class _FlatBuffers(NamedTuple):
    """A flat batch's flat tensors, one per role (parameters, gradients, each state), and
    their pieces in the batch's shapes; kept from step to step for the batch's layout."""

    flats: list[Tensor]
    pieces: list[list[Tensor]]  # per role
    rows: list[Tensor]  # the parameters' flat tensor as (count, numel) per run of one shape

    @classmethod
    def make(cls, roles: int, runs: list[tuple[torch.Size, int]], device: torch.device, dtype: torch.dtype):
        sizes = [shape.numel() * count for shape, count in runs]
        flats = [torch.empty(sum(sizes), device=device, dtype=dtype) for _ in range(roles)]
        pieces = [
            [piece for (shape, count), chunk in zip(runs, flat.split(sizes)) for piece in chunk.view(count, *shape)]
            for flat in flats
        ]
        rows = [chunk.view(count, -1) for (_, count), chunk in zip(runs, flats[0].split(sizes))]
        return cls(flats, pieces, rows)


# flat batches' layouts whose buffers an optimizer keeps (the oldest goes first)
KEPT_LAYOUTS = 8


def _compiled_flat_step(
    descend: Descend,
    tensors: Sequence[tuple[Tensor, ...]],
    positions: list[int],
    mirrored: Sequence[bool],
    packed: _PackedByDevice,
    order: str,
    guard: bool,
    norm_cap: float | None,
    buffers: dict | None,
) -> bool:
    """The compiled kernel once over the tuples at ``positions`` (of one device and dtype, the
    mirrored ones first, sorted by shape): each role (parameters, gradients, each state) is
    copied into one flat tensor by one ``_foreach_copy_`` (in each tensor's logical order,
    whatever its strides), stepped, and the new parameters and state are copied back by one
    ``_foreach_copy_`` per role. The flat tensors and their pieces in the tensors' shapes are
    made once per layout (the runs of shapes) and kept in ``buffers`` (the optimizer's; made
    anew at every call without it): making the pieces costs more host time than the copies.
    The step is elementwise: an element's new value does not depend on its neighbours in the
    flat tensor, and the elements below the mirrored tensors' count take the mirror step. With
    ``norm_cap`` the flat parameters are capped per tensor (one norm and one scaling per run of
    a shape) before they are written back. False if the kernel is not available."""
    runs: list[tuple[torch.Size, int]] = []  # (shape, count) of consecutive tensors
    bound = 0  # elements that take the mirror step
    last, count = None, 0
    for p in positions:
        shape = tensors[p][0].shape
        if (shape, mirrored[p]) != last:
            if count:
                runs.append((last[0], count))
            last, count = (shape, mirrored[p]), 0
        count += 1
        if mirrored[p]:
            bound += shape.numel()
    runs.append((last[0], count))
    first = tensors[positions[0]][0]
    key = (first.device, first.dtype, len(tensors[positions[0]]), tuple(runs))
    flat = None if buffers is None else buffers.get(key)
    if flat is None:
        flat = _FlatBuffers.make(len(tensors[positions[0]]), runs, first.device, first.dtype)
        if buffers is not None:
            if len(buffers) >= KEPT_LAYOUTS:
                del buffers[next(iter(buffers))]
            buffers[key] = flat
    columns = [list(column) for column in zip(*(tensors[p] for p in positions))]
    for pieces, column in zip(flat.pieces, columns):
        torch._foreach_copy_(pieces, column)
    if not _compiled_step(descend, flat.flats, packed, order, guard, float(bound)):
        return False
    if norm_cap is not None:
        for rows in flat.rows:
            # as HAM's _after_step computes it: min(1, norm_cap / norm), a zero tensor keeps 1
            norms = torch.linalg.vector_norm(rows, dim=1)
            rows.mul_(torch.clamp(norm_cap / norms.clamp(min=torch.finfo(rows.dtype).tiny), max=1.0)[:, None])
    for role, (pieces, column) in enumerate(zip(flat.pieces, columns)):
        if role != 1:  # the gradient is only read
            torch._foreach_copy_(column, pieces)
    return True


def _compiled_step(
    descend: Descend, tensors: Sequence[Tensor], packed: _PackedByDevice, order: str, guard: bool, mirrored: float
) -> bool:
    """The compiled kernel on 1-D tensors, whose elements below the index ``mirrored`` take the
    mirror step; False if it is not available."""
    if "torch.compile" in _failed:
        return False
    param, grad, *state = tensors
    try:
        _compiled_kernel()(
            descend, param, grad, tuple(state), packed[param.device, compute_dtype(param.dtype), mirrored], order, guard
        )
    except Exception as error:  # noqa: BLE001 - any compiler failure: fall back, loudly
        _give_up("torch.compile", error, "plain path")
        return False
    return True
