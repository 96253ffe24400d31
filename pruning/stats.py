"""Sparsity and weight-magnitude statistics over a set of weights.

Sparsity is the fraction of exact zeros, per weight and over the whole set (the
prunable set, as AC/DC (Peste et al., NeurIPS 2021) and magnitude pruning (Zhu & Gupta,
2017) report it). The magnitude histogram is what the HORST paper's weight-distribution
figure compares across optimizers: HORST concentrates weights near zero, AdamW's are
broad. Pass the same ``value_range`` for every model to compare them on common bins.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ._checks import check_weights


def sparsity_stats(weights: Mapping[str, Tensor]) -> dict:
    """``{"overall": float, "per_layer": {name: float}, "zeros": int, "numel": int}``,
    sparsities as fractions of exact zeros."""
    check_weights(weights)
    per_layer, zeros, numel = {}, 0, 0
    for name, weight in weights.items():
        layer_zeros = weight.numel() - int(weight.detach().count_nonzero())
        per_layer[name] = layer_zeros / weight.numel()
        zeros += layer_zeros
        numel += weight.numel()
    return {"overall": zeros / numel, "per_layer": per_layer, "zeros": zeros, "numel": numel}


def magnitude_histogram(
    weights: Mapping[str, Tensor],
    *,
    bins: int = 100,
    log: bool = True,
    value_range: tuple[float, float] | None = None,
) -> tuple[Tensor, Tensor]:
    """Histogram of |w| over all ``weights``: ``(counts, edges)``, int64 counts of
    length ``bins`` and float64 edges of length ``bins + 1``.

    With ``log=True`` the values are log10|w| of the *non-zero* weights (zeros, e.g.
    pruned ones, have no logarithm: see :func:`sparsity_stats` for them) and the edges
    are in log10 units. ``value_range=(low, high)`` fixes the edges (values outside are
    not counted); by default they span the data.
    """
    check_weights(weights)
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive int, got {bins!r}")
    if value_range is None:
        low, high = _data_range(weights, log)
    else:
        low, high = (float(x) for x in value_range)
        if not low < high:
            raise ValueError(f"value_range must be (low, high) with low < high, got {value_range!r}")
    counts = torch.zeros(bins, dtype=torch.float64)
    for weight in weights.values():
        # Counted on the CPU: torch.histc has no deterministic CUDA kernel (deterministic runs
        # would stop here), and every device then bins alike. float64 so that counts stay exact
        # beyond 2**24 per bin.
        values = _histogram_values(weight, log).cpu().double()
        counts += torch.histc(values, bins=bins, min=low, max=high)
    return counts.long(), torch.linspace(low, high, bins + 1, dtype=torch.float64)


def _data_range(weights: Mapping[str, Tensor], log: bool) -> tuple[float, float]:
    low, high = float("inf"), float("-inf")
    for weight in weights.values():
        values = _histogram_values(weight, log)
        if values.numel():
            low, high = min(low, float(values.min())), max(high, float(values.max()))
    if low > high:
        raise ValueError("all weights are zero: a log-magnitude histogram has nothing to count (use log=False)")
    if low == high:
        low, high = low - 0.5, high + 0.5
    return low, high


def _histogram_values(weight: Tensor, log: bool) -> Tensor:
    magnitudes = weight.detach().abs().reshape(-1).float()
    if log:
        return magnitudes[magnitudes > 0].log10()
    return magnitudes
