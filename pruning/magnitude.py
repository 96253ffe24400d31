"""Unstructured magnitude pruning: keep the largest |w|, layerwise or globally.

Magnitude pruning (Han et al., "Learning both Weights and Connections for Efficient
Neural Networks", NeurIPS 2015; Zhu & Gupta, "To prune, or not to prune", 2017) removes
the weights of smallest absolute value. AC/DC (Peste et al., NeurIPS 2021) recomputes a
global mask over the prunable set at every compression; one-shot pruning of language
models (the SparseGPT/Wanda magnitude baseline) prunes each matrix layerwise.

* ``scope="layerwise"``: every matrix of n entries loses exactly floor(s * n) entries.
* ``scope="global"``: one threshold over all N prunable entries; exactly floor(s * N)
  entries are removed in all.

Ties at the threshold are broken deterministically: among equal magnitudes the entry
that comes first (mapping order, then row-major index) is pruned first.

Speed: a full sort costs O(n log n); the threshold is the k-th smallest |w|, which
selection finds in O(n). ``torch.kthvalue`` over millions of entries is itself slow on
CPU (it copies and partitions them all), so the k-th value is first bracketed from a
strided sample of ~32k entries (+-4 standard deviations of the sample rank); entries
above the bracket are kept and entries below it pruned with one comparison each, and
only those inside (~2 %) go to ``kthvalue``. Should the bracket miss, all entries are
ranked instead: the result is always exact, the sample only decides how fast it comes
(bench/pruning.py: ~15x faster than a sort, ~3-6x faster than plain kthvalue).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ._checks import check_sparsity, check_weights

SCOPES = ("layerwise", "global")

_EXACT_BELOW = 1 << 17  # below this many entries sampling does not pay off
_SAMPLE_SIZE = 1 << 15
_SAMPLE_SIGMAS = 4.0


def magnitude_masks(weights: Mapping[str, Tensor], sparsity: float, *, scope: str = "layerwise") -> dict[str, Tensor]:
    """Bool masks (True = kept) that remove the smallest-magnitude fraction ``sparsity``.

    Args:
        weights: ``{name: tensor}``, e.g. from :func:`pruning.prunable_parameters`.
        sparsity: fraction to remove, in [0, 1).
        scope: ``"layerwise"`` (floor(s * n) per tensor) or ``"global"`` (one threshold,
            floor(s * N) over all tensors).
    """
    check_weights(weights)
    check_sparsity(sparsity)
    if scope not in SCOPES:
        raise ValueError(f"scope={scope!r} is unknown; choose one of {SCOPES}")
    names = list(weights)
    flat = [weights[name].detach().reshape(-1) for name in names]
    scratch = _Scratch()
    with torch.no_grad():
        if scope == "layerwise":
            flat_masks = [_prune_smallest([f], sparsity, f.dtype, scratch)[0] for f in flat]
        else:
            flat_masks = _prune_smallest(flat, sparsity, _common_dtype(flat), scratch)
    return {name: mask.view(weights[name].shape) for name, mask in zip(names, flat_masks, strict=True)}


def prune_(weights: Mapping[str, Tensor], sparsity: float, *, scope: str = "layerwise") -> dict[str, Tensor]:
    """Zero the pruned entries of ``weights`` in place; return the masks (True = kept)."""
    masks = magnitude_masks(weights, sparsity, scope=scope)
    apply_masks_(weights, masks)
    return masks


def apply_masks_(weights: Mapping[str, Tensor], masks: Mapping[str, Tensor]) -> None:
    """Set ``weights[name][~masks[name]] = 0`` in place for every name in ``masks``."""
    with torch.no_grad():
        for name, mask in masks.items():
            weights[name].masked_fill_(~mask, 0)


def _prune_smallest(flat: Sequence[Tensor], sparsity: float, dtype: torch.dtype, scratch: _Scratch) -> list[Tensor]:
    """Keep-masks over the concatenation of the flat tensors ``flat`` that drop exactly
    floor(sparsity * N) entries: the smallest |w| (compared in ``dtype``), and among
    ties the earliest."""
    total = sum(f.numel() for f in flat)
    num_pruned = math.floor(sparsity * total)
    if num_pruned == 0:
        return [torch.ones_like(f, dtype=torch.bool) for f in flat]
    if total > _EXACT_BELOW:
        bracket = _sampled_bracket(flat, num_pruned, total, dtype)
        keep = _prune_within(flat, num_pruned, *bracket, dtype, scratch)
        if keep is not None:
            return keep
    unbounded = torch.tensor(math.inf, dtype=dtype, device=flat[0].device)
    return _prune_within(flat, num_pruned, -unbounded, unbounded, dtype, scratch)


def _sampled_bracket(flat: Sequence[Tensor], num_pruned: int, total: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Values (low, high) that very likely enclose the num_pruned-th smallest |w|, from
    a strided sample. The stride is prime, so it cycles through the columns of any
    matrix whose row length it does not divide."""
    stride = _next_prime(total // _SAMPLE_SIZE)
    sample = torch.cat([f[stride // 2 :: stride].abs().to(dtype) for f in flat])
    size = sample.numel()
    quantile = num_pruned / total
    spread = _SAMPLE_SIGMAS * math.sqrt(size * quantile * (1 - quantile)) + 1
    low_rank, high_rank = math.floor(quantile * size - spread), math.ceil(quantile * size + spread)
    low = sample.kthvalue(low_rank + 1).values if low_rank >= 0 else sample.new_tensor(-math.inf)
    high = sample.kthvalue(high_rank + 1).values if high_rank < size else sample.new_tensor(math.inf)
    return low, high


def _prune_within(
    flat: Sequence[Tensor], num_pruned: int, low: Tensor, high: Tensor, dtype: torch.dtype, scratch: _Scratch
) -> list[Tensor] | None:
    """Keep-masks, if the num_pruned-th smallest |w| lies in [low, high], else None.

    Entries above ``high`` are kept and entries below ``low`` pruned without further
    work; only the candidates in between are ranked exactly."""
    keep, positions, candidates = [], [], []
    num_below = 0
    for f in flat:
        magnitudes = scratch.get(f.numel(), dtype, f.device)
        if f.dtype == dtype:
            torch.abs(f, out=magnitudes)
        else:  # abs() cannot write to a wider dtype directly
            magnitudes.copy_(f).abs_()
        above = magnitudes > high
        inside = torch.ge(magnitudes, low, out=scratch.get(f.numel(), torch.bool, f.device))
        num_below += f.numel() - int(inside.count_nonzero())
        inside.logical_xor_(above)
        position = inside.nonzero().squeeze(1)
        keep.append(above)
        positions.append(position)
        candidates.append(magnitudes.index_select(0, position))
    candidates = torch.cat(candidates)
    rank = num_pruned - num_below
    if not 0 < rank <= candidates.numel():
        return None
    keep_candidates = _keep_all_but_smallest(candidates, rank)
    parts = keep_candidates.split([p.numel() for p in positions])
    for mask, position, part in zip(keep, positions, parts, strict=True):
        mask[position] = part
    return keep


def _keep_all_but_smallest(values: Tensor, rank: int) -> Tensor:
    """Keep-mask of flat ``values`` without its ``rank`` smallest, earliest among ties."""
    threshold = values.kthvalue(rank).values
    keep = values > threshold
    ties = (values == threshold).nonzero().squeeze(1)
    num_smaller = values.numel() - int(keep.count_nonzero()) - ties.numel()
    keep[ties[rank - num_smaller :]] = True
    return keep


def _next_prime(n: int) -> int:
    candidate = max(n, 2)
    while any(candidate % d == 0 for d in range(2, math.isqrt(candidate) + 1)):
        candidate += 1
    return candidate


class _Scratch:
    """Reusable flat buffers, one per (dtype, device). Fresh multi-megabyte tensors on
    every matrix cost as much in page faults as the arithmetic done in them."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.dtype, torch.device], Tensor] = {}

    def get(self, numel: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        buffer = self._buffers.get((dtype, device))
        if buffer is None or buffer.numel() < numel:
            buffer = self._buffers[(dtype, device)] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel]


def _common_dtype(tensors) -> torch.dtype:
    dtypes = {t.dtype for t in tensors}
    dtype = dtypes.pop()
    for other in dtypes:
        dtype = torch.promote_types(dtype, other)
    return dtype
