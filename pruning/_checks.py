"""Argument checks shared by the pruning functions: bad input fails early, by name."""

from __future__ import annotations

import numbers
from collections.abc import Mapping

from torch import Tensor


def check_sparsity(sparsity: float) -> None:
    if isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real) or not 0 <= sparsity < 1:
        raise ValueError(f"sparsity must be a number in [0, 1), got {sparsity!r}")


def check_weights(weights: Mapping[str, Tensor]) -> None:
    if not isinstance(weights, Mapping):
        raise ValueError(
            f"weights must be a mapping {{name: tensor}} (e.g. from prunable_parameters), got {type(weights).__name__}"
        )
    if not weights:
        raise ValueError("weights is empty; nothing to prune (check the prunable selection)")
    for name, weight in weights.items():
        if not isinstance(weight, Tensor) or not weight.is_floating_point():
            raise ValueError(f"weights[{name!r}] must be a floating-point tensor, got {type(weight).__name__}")
