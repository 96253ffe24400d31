"""The fast path: one fused pass per tensor instead of a chain of elementwise ops.

Which path steps a ``(param, grad, *state)`` tuple is decided in one place, ``route``:

* Dense float32 tensors on CPU: ``horst._cpu_kernel``, a C kernel called once per batch of
  tensors that share the step's scalars (``torch.compile``'s CPU code was ~2x
  ``torch.optim.AdamW(fused=True)`` per tensor, plus ~0.2 ms of call overhead per tensor).
* Other tensors of a dense layout, or small ones (CUDA, bf16): ``horst.functional.mirror_step_``
  compiled by ``torch.compile``, one call over all of them (a multi-tensor step, as
  ``torch.optim``'s foreach implementations take one call per device and dtype; one kernel
  per tensor, Triton on CUDA). Tensors of fewer than ``FLAT_NUMEL`` elements enter it as flat
  copies, one per device and dtype, those that take the mirror step and those that do not
  together (docs/design.md §2.5); larger ones on their own memory, as 1-D aliases. Sizes are
  dynamic, so one compilation serves every step of a run (one more per base, order, guard,
  dtype and set of tensors with a gradient).
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


def _mirror_step_many_(
    descend: Descend, entries: list[tuple[tuple[Tensor, ...], Tensor]], order: str, guard: bool
) -> None:
    """``mirror_step_`` on each entry, ``((param, grad, *state), packed)`` of 1-D tensors: one
    compiled graph for all of them. ``packed`` is the entry's scalars (``horst.functional.pack``),
    followed by the bound below which its elements take the mirror step."""
    for (param, grad, *state), packed in entries:
        *values, mirrored = packed.unbind()
        mirror_step_(descend, param, grad, tuple(state), Scalars(*values), order, guard, mirrored)


# one graph per base, order, guard, dtype and set of tensors: more than dynamo's default limit of 8
RECOMPILE_LIMIT = 64


@functools.cache
def _compiled_kernel():
    # the limit is this function's own (not a dynamo.config.patch around every call: host time)
    return torch.compile(_mirror_step_many_, dynamic=True, fullgraph=True, recompile_limit=RECOMPILE_LIMIT)


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


class Routes(NamedTuple):
    """The positions of the tuples each path steps (``route``)."""

    plain: list[int]
    kernel: list[int]  # the C kernel
    flat: list[int]  # the compiled call, from flat copies
    in_place: list[int]  # the compiled call, on their own memory


def route(
    tensors: Sequence[tuple[Tensor, ...]],
    positions: Sequence[int],
    fast: bool,
    modes: tuple[int | None, int | None],
    mirrored: Sequence[bool],
) -> Routes:
    """The path that steps each ``(param, grad, *state)`` tuple at ``positions``; the one place
    that decides it. ``modes``: the C kernel's mirror mode for the step's scalars without and
    with the mirror step (``kernel_mode``), chosen by the tuple's ``mirrored`` flag.

    * the plain path: ``fast`` off, or a tensor subclass among the tuple's (a DTensor not
      reduced to its local shard, ``horst.optimizer.local_shards``), or whatever the compiled
      call cannot take once it has failed in this process;
    * the C kernel: dense float32 CPU tensors whose scalars it has a mode for, until it fails
      to build (then the compiled call takes them);
    * the compiled call from flat copies: tensors of one dtype with at least one dimension and
      fewer than ``FLAT_NUMEL`` elements, in any strides (copied in logical order);
    * the compiled call in place: the other tuples of one dense layout (``dense_layout``);
    * the plain path: the rest (a large tensor laid out unlike its gradient, a strided slice).
    """
    routes = Routes([], [], [], [])
    kernel_ok = "C kernel" not in _failed
    compiler_ok = "torch.compile" not in _failed
    for index in positions:
        group = tensors[index]
        param = group[0]
        dtype = param.dtype
        plain_types = one_dtype = True
        for t in group:  # a loop, not all(...): this runs for every tensor at every step
            if type(t) not in PLAIN_TENSOR_TYPES:
                plain_types = False
                break
            if t.dtype != dtype:
                one_dtype = False
        if not (fast and plain_types):
            routes.plain.append(index)
        elif (
            kernel_ok
            and dtype == torch.float32
            and param.device.type == "cpu"
            and modes[mirrored[index]] is not None
            and dense_layout(group)
            and _cpu_kernel.supports(group)
        ):
            routes.kernel.append(index)
        elif compiler_ok and one_dtype and param.ndim and param.numel() < FLAT_NUMEL:
            routes.flat.append(index)
        elif compiler_ok and dense_layout(group):
            routes.in_place.append(index)
        else:
            routes.plain.append(index)
    return routes


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
    mirror step, on the paths ``route`` picks (with ``fast`` off: the plain path). The tuples
    that ``mirrored`` marks False (default: none) take the base's step alone (the mirror's
    scalars at 0) and no ``guard``.

    ``norm_cap`` (HAM's): each new parameter of a tuple ``whole`` marks (default: all; a shard's
    norm is not its tensor's) whose L2 norm exceeds it is rescaled to it where the path can do
    it in its own pass: the C kernel sums the squares as it steps, the compiled call's flat
    copies are scaled before they are written back. Returns per tuple whether it was capped here.

    ``buffers``: a dict the caller keeps from step to step (an optimizer's), in which the
    compiled call keeps its flat copies of small tensors (``_flat_copies``)."""
    n = len(tensors)
    mirrored = [True] * n if mirrored is None else mirrored
    whole = [True] * n if whole is None else whole
    off = s._replace(alpha_u=0.0, alpha_g=0.0, lr_beta=0.0, clip=math.inf)
    modes = (kernel_mode(off, order, False), kernel_mode(s, order, guard))  # by mirrored
    routes = route(tensors, range(n), fast, modes, mirrored)
    capped = [False] * n
    for is_mirrored in (False, True):
        positions = [p for p in routes.kernel if mirrored[p] == is_mirrored]
        if not positions:
            continue
        sums = _cpu_kernel_step(
            [tensors[p] for p in positions], (off, s)[is_mirrored], kernel_base, modes[is_mirrored], norm_cap
        )
        if sums is False:  # the kernel is not available: the next path takes them
            for path, more in zip(routes, route(tensors, positions, fast, modes, mirrored)):
                path += more
        elif sums is not None:
            for p, total in zip(positions, sums):
                if whole[p]:
                    _cap(tensors[p][0], total, norm_cap)
                    capped[p] = True
    if routes.flat or routes.in_place:
        routes.plain.extend(
            _compiled_step(
                descend, tensors, routes, mirrored, whole, _PackedByDevice(s), order, guard, norm_cap, capped, buffers
            )
        )
    for index in routes.plain:
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


# Tensors of fewer elements enter the compiled call as flat copies: for them the cost of a
# kernel (a launch on CUDA) outweighs copying their elements; larger ones are stepped in place.
FLAT_NUMEL = 1 << 16
# At most this many elements in one set of flat copies: bounds the copies' memory.
FLAT_BATCH_NUMEL = 1 << 22


def _compiled_step(
    descend: Descend,
    tensors: Sequence[tuple[Tensor, ...]],
    routes: Routes,
    mirrored: Sequence[bool],
    whole: Sequence[bool],
    packed: _PackedByDevice,
    order: str,
    guard: bool,
    norm_cap: float | None,
    capped: list[bool],
    buffers: dict | None,
) -> list[int]:
    """The compiled kernel once over the tuples at ``routes.flat`` and ``routes.in_place``: the
    positions it left to the plain path (all of them if it is not available); sets ``capped``.

    The ``flat`` tuples (all tensors of a tuple in the parameter's dtype) are copied into flat
    tensors (``_flat_copies``), one set per device, dtype and ``whole`` flag, mirrored and not
    mirrored together, at most ``FLAT_BATCH_NUMEL`` elements in a set; the ``in_place`` ones
    are stepped on their own memory through 1-D aliases. With ``norm_cap`` the flat copies of
    ``whole`` tuples are capped per tensor (one norm and one scaling per run of a shape) before
    they are written back."""
    by_kind: dict[tuple[torch.device, torch.dtype, bool], list[int]] = defaultdict(list)
    for p in routes.flat:
        param = tensors[p][0]
        by_kind[param.device, param.dtype, whole[p]].append(p)
    batches: list[tuple[list[int], float | None]] = []  # (positions in one set of flat copies, their cap)
    for (_, _, is_whole), positions in by_kind.items():
        # mirrored first (the kernel's mask is an index bound), then by shape: few runs of one shape
        positions.sort(key=lambda p: (not mirrored[p], tensors[p][0].shape))
        numel = FLAT_BATCH_NUMEL
        for p in positions:
            size = tensors[p][0].numel()
            if numel + size > FLAT_BATCH_NUMEL:
                batches.append(([], norm_cap if is_whole else None))
                numel = 0
            batches[-1][0].append(p)
            numel += size
    entries = []
    copies = []
    for positions, cap in batches:
        flat, columns, bound = _flat_copies(tensors, positions, mirrored, buffers)
        first = flat.flats[0]
        entries.append((tuple(flat.flats), packed[first.device, compute_dtype(first.dtype), float(bound)]))
        copies.append((flat, columns, cap))
    for p in routes.in_place:
        aliases = flat_aliases(tensors[p])
        param = aliases[0]
        entries.append((aliases, packed[param.device, compute_dtype(param.dtype), math.inf if mirrored[p] else 0.0]))
    if "torch.compile" not in _failed:
        try:
            _compiled_kernel()(descend, entries, order, guard)
        except Exception as error:  # noqa: BLE001 - any compiler failure: fall back, loudly
            _give_up("torch.compile", error, "plain path")
    if "torch.compile" in _failed:
        return routes.flat + routes.in_place
    for (positions, cap), (flat, columns, _) in zip(batches, copies):
        if cap is not None:
            for rows in flat.rows:
                # as HAM's _after_step computes it: min(1, norm_cap / norm), a zero tensor keeps 1
                norms = torch.linalg.vector_norm(rows, dim=1)
                rows.mul_(torch.clamp(cap / norms.clamp(min=torch.finfo(rows.dtype).tiny), max=1.0)[:, None])
            for p in positions:
                capped[p] = True
        for role, (pieces, column) in enumerate(zip(flat.pieces, columns)):
            if role != 1:  # the gradient is only read
                torch._foreach_copy_(column, pieces)
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


def _flat_copies(
    tensors: Sequence[tuple[Tensor, ...]], positions: list[int], mirrored: Sequence[bool], buffers: dict | None
) -> tuple[_FlatBuffers, list[list[Tensor]], int]:
    """The tuples at ``positions`` (of one device and dtype, the mirrored ones first, sorted by
    shape) copied into flat tensors, one per role (parameters, gradients, each state), by one
    ``_foreach_copy_`` per role (in each tensor's logical order, whatever its strides): the flat
    tensors, the tuples' tensors per role (to copy the new values back to), and the count of
    elements that take the mirror step (the first ones). The step is elementwise: an element's
    new value does not depend on its neighbours in the flat tensor. The flat tensors and their
    pieces in the tensors' shapes are made once per layout (the runs of shapes) and kept in
    ``buffers`` (the optimizer's; made anew at every call without it): making the pieces costs
    more host time than the copies."""
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
    return flat, columns, bound
