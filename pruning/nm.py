"""N:M semi-structured sparsity: keep the n largest |w| of every m consecutive weights.

2:4 sparsity is what NVIDIA Ampere sparse tensor cores accelerate (Mishra et al.,
"Accelerating Sparse Deep Neural Networks", arXiv 2104.08378, 2021); any n of m is
allowed here. Groups run along the *input* dimension of each weight, the one summed over
in the matrix product:

* ``nn.Linear`` weight [out, in] and ``nn.Conv2d`` weight [out, in, kh, kw]: ``dim=1``
  (the default);
* HF ``transformers.pytorch_utils.Conv1D`` (GPT-2) weight [in, out]: ``dim=0``.

:func:`pruning.input_dims` returns the right ``dim`` for every weight of a model. Ties
are broken as in :mod:`pruning.magnitude`: among equal magnitudes the earlier entry of
the group is pruned first.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ._checks import check_weights


def nm_masks(
    weights: Mapping[str, Tensor], *, n: int = 2, m: int = 4, dim: int | Mapping[str, int] = 1
) -> dict[str, Tensor]:
    """Bool masks (True = kept) with exactly ``n`` kept entries in every group of ``m``
    consecutive entries along ``dim`` (an int for all weights, or ``{name: dim}``)."""
    check_weights(weights)
    for argument, value in (("n", n), ("m", m)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{argument} must be an int, got {value!r}")
    if not 0 < n <= m:
        raise ValueError(f"need 0 < n <= m (keep n of every m weights), got n={n}, m={m}")
    masks = {}
    with torch.no_grad():
        for name, weight in weights.items():
            group_dim = _dim_of(name, weight, dim)
            _check_divisible(name, weight, group_dim, m)
            masks[name] = _nm_mask(weight, n, m, group_dim)
    return masks


def _nm_mask(weight: Tensor, n: int, m: int, dim: int) -> Tensor:
    magnitudes = weight.detach().abs().movedim(dim, -1)
    size = magnitudes.shape[-1]
    groups = magnitudes.reshape(*magnitudes.shape[:-1], size // m, m)
    # Stable ascending order: the m - n smallest go, the earlier one first among ties.
    smallest = groups.argsort(dim=-1, stable=True)[..., : m - n]
    keep = torch.ones_like(groups, dtype=torch.bool).scatter_(-1, smallest, False)
    return keep.reshape(magnitudes.shape).movedim(-1, dim).contiguous()


def _dim_of(name: str, weight: Tensor, dim: int | Mapping[str, int]) -> int:
    if isinstance(dim, Mapping):
        if name not in dim:
            raise ValueError(f"dim has no entry for weight {name!r}; pass one per weight (see pruning.input_dims)")
        dim = dim[name]
    if not -weight.ndim <= dim < weight.ndim:
        raise ValueError(f"dim={dim} is out of range for weight {name!r} of shape {tuple(weight.shape)}")
    return dim % weight.ndim


def _check_divisible(name: str, weight: Tensor, dim: int, m: int) -> None:
    if weight.shape[dim] % m:
        raise ValueError(
            f"weight {name!r} of shape {tuple(weight.shape)} has {weight.shape[dim]} entries along "
            f"dim {dim}, not a multiple of m={m}; N:M groups must tile the input dimension"
        )
