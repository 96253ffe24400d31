"""One-shot pruning by name: a method (how weights are scored) and a pattern (where zeros
may go), as the pipelines' configs choose them.

* methods: ``"magnitude"`` (|w|; :mod:`pruning.magnitude`) and ``"wanda"`` (|w| x input
  norm, compared within each output row; :mod:`pruning.wanda`, needs calibration norms);
* patterns: ``"unstructured"`` (any fraction ``sparsity``) and ``"n:m"`` such as ``"2:4"``
  (n kept of every m consecutive inputs, so the sparsity is 1 - n/m; :mod:`pruning.nm`).

Magnitude, unstructured, compares layerwise or globally (``scope``); every other pair
compares within a row of a matrix (Wanda) or a group of m inputs (N:M), so ``scope`` does
not apply to it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from torch import Tensor

from .magnitude import apply_masks_, magnitude_masks
from .nm import nm_masks
from .wanda import wanda_masks, wanda_scores

METHODS = ("magnitude", "wanda")
UNSTRUCTURED = "unstructured"
_NM = re.compile(r"^(\d+):(\d+)$")


def parse_pattern(pattern: str) -> tuple[int, int] | None:
    """``None`` for ``"unstructured"``, ``(n, m)`` for ``"n:m"`` with 0 < n < m."""
    if pattern == UNSTRUCTURED:
        return None
    match = _NM.match(str(pattern))
    if match is None or not 0 < int(match.group(1)) < int(match.group(2)):
        raise ValueError(
            f"pattern={pattern!r} is unknown; use 'unstructured' or 'n:m' with 0 < n < m such as '2:4' "
            '(in YAML quote it: "2:4", unquoted YAML reads 2:4 as the number 124)'
        )
    return int(match.group(1)), int(match.group(2))


def pattern_sparsity(pattern: str, sparsity: float | None = None) -> float:
    """The sparsity a pattern gives: 1 - n/m for N:M, else ``sparsity``."""
    nm = parse_pattern(pattern)
    return sparsity if nm is None else 1 - nm[0] / nm[1]


def one_shot_masks(
    weights: Mapping[str, Tensor],
    *,
    method: str = "magnitude",
    pattern: str = UNSTRUCTURED,
    sparsity: float | None = None,
    dim: int | Mapping[str, int] = 1,
    input_norms: Mapping[str, Tensor] | None = None,
    scope: str = "layerwise",
) -> dict[str, Tensor]:
    """Bool masks (True = kept) for ``method`` and ``pattern``.

    ``sparsity`` is the fraction to remove for ``"unstructured"``; for ``"n:m"`` it may be
    omitted and otherwise must equal 1 - n/m. ``dim`` is each weight's input dimension
    (:func:`pruning.input_dims`), needed by Wanda and N:M; ``input_norms`` (from
    :class:`pruning.InputNorms`) by Wanda."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} is unknown; choose one of {METHODS}")
    nm = parse_pattern(pattern)
    if nm is None and sparsity is None:
        raise ValueError("unstructured pruning needs a sparsity")
    if nm is not None and sparsity is not None and abs(sparsity - (1 - nm[0] / nm[1])) > 1e-9:
        raise ValueError(
            f"pattern {pattern} keeps {nm[0]} of {nm[1]}: its sparsity is {1 - nm[0] / nm[1]:g}, not {sparsity:g}"
        )
    if method == "wanda" and input_norms is None:
        raise ValueError("method='wanda' needs input_norms: calibrate with pruning.InputNorms")
    if method == "magnitude":
        if nm is None:
            return magnitude_masks(weights, sparsity, scope=scope)
        return nm_masks(weights, n=nm[0], m=nm[1], dim=dim)
    if nm is None:
        return wanda_masks(weights, input_norms, sparsity, dim=dim)
    return nm_masks(wanda_scores(weights, input_norms, dim=dim), n=nm[0], m=nm[1], dim=dim)


def one_shot_prune_(weights: Mapping[str, Tensor], **kwargs) -> dict[str, Tensor]:
    """Zero the pruned entries of ``weights`` in place (:func:`one_shot_masks`'s arguments);
    return the masks."""
    masks = one_shot_masks(weights, **kwargs)
    apply_masks_(weights, masks)
    return masks
