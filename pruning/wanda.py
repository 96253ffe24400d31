"""Wanda: prune by |weight| x input-activation norm, compared within each output row.

Wanda (Sun, Liu, Bair, Kolter, "A Simple and Effective Pruning Approach for Large Language
Models", ICLR 2024) scores weight W[i, j] (output i, input feature j) by

    S[i, j] = |W[i, j]| * ||X_j||_2

where ||X_j||_2 is the L2 norm of input feature j over all calibration tokens, and removes
the lowest scores *within each output row* (each output neuron loses the same fraction of
its inputs). For N:M sparsity it keeps the n highest scores of every m consecutive inputs.

Layouts: ``nn.Linear`` weight [out, in] has its inputs along dim 1; HF ``Conv1D`` (GPT-2)
weight [in, out] along dim 0 (:func:`pruning.input_dims`). Ties are broken as everywhere
in :mod:`pruning`: among equal scores the earlier input is pruned first.

Calibration (:class:`InputNorms`): forward hooks on the modules owning the weights sum x_j^2
over every token they see; the norm is the square root of that sum. This is a one-pass
variant: all activations come from the *dense* model. Wanda's reference code instead
prunes block by block and feeds each block the outputs of the already pruned blocks before
it; the one-pass scores differ from it only through those inputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from ._checks import check_sparsity, check_weights


def wanda_scores(
    weights: Mapping[str, Tensor], input_norms: Mapping[str, Tensor], *, dim: int | Mapping[str, int] = 1
) -> dict[str, Tensor]:
    """``{name: |W| * ||X_j||_2}`` with the norm broadcast along the input dimension ``dim``
    (an int for all weights, or ``{name: dim}``; 1 for ``nn.Linear``, 0 for ``Conv1D``)."""
    check_weights(weights)
    scores = {}
    for name, weight in weights.items():
        if weight.ndim != 2:
            raise ValueError(f"Wanda scores 2-D weights; {name!r} has shape {tuple(weight.shape)}")
        input_dim = _dim_of(name, dim)
        if name not in input_norms:
            raise ValueError(f"no input norms for weight {name!r}; calibrate every weight (pruning.InputNorms)")
        norm = input_norms[name]
        if norm.shape != (weight.shape[input_dim],):
            raise ValueError(
                f"input norms of {name!r} have shape {tuple(norm.shape)}, expected ({weight.shape[input_dim]},) "
                f"for weight {tuple(weight.shape)} with inputs along dim {input_dim}"
            )
        norm = norm.to(weight.device, torch.float32)
        scores[name] = weight.detach().abs().float() * (norm[:, None] if input_dim == 0 else norm[None, :])
    return scores


def wanda_masks(
    weights: Mapping[str, Tensor],
    input_norms: Mapping[str, Tensor],
    sparsity: float,
    *,
    dim: int | Mapping[str, int] = 1,
) -> dict[str, Tensor]:
    """Bool masks (True = kept): every output row loses exactly floor(sparsity * inputs) of
    its lowest-scoring entries (:func:`wanda_scores`)."""
    check_sparsity(sparsity)
    scores = wanda_scores(weights, input_norms, dim=dim)
    return {name: _row_masks(score, sparsity, _dim_of(name, dim)) for name, score in scores.items()}


def _row_masks(score: Tensor, sparsity: float, input_dim: int) -> Tensor:
    rows = score.movedim(input_dim, -1)  # [out, in]
    num_pruned = math.floor(sparsity * rows.shape[-1])
    keep = torch.ones_like(rows, dtype=torch.bool)
    if num_pruned:
        lowest = rows.argsort(dim=-1, stable=True)[:, :num_pruned]
        keep.scatter_(-1, lowest, False)
    return keep.movedim(-1, input_dim).contiguous()


def _dim_of(name: str, dim: int | Mapping[str, int]) -> int:
    if isinstance(dim, Mapping):
        if name not in dim:
            raise ValueError(f"dim has no entry for weight {name!r}; pass one per weight (see pruning.input_dims)")
        dim = dim[name]
    if dim not in (0, 1, -1, -2):
        raise ValueError(f"dim={dim} is not a dimension of a 2-D weight")
    return dim % 2


class InputNorms:
    """Collects ||X_j||_2 of the inputs of the modules owning ``weights`` while active::

        with pruning.InputNorms(model, weights) as norms:
            for batch in calibration_batches:
                model(batch)
        scores = pruning.wanda_scores(weights, norms.norms(), dim=pruning.input_dims(model, weights))

    The sums of squares accumulate in float64 over every token (all leading dimensions of
    the module's input); :meth:`norms` returns their square roots as float32 tensors.
    """

    def __init__(self, model: nn.Module, weights: Mapping[str, Tensor]):
        check_weights(weights)
        owners = {id(getattr(m, "weight", None)): m for m in model.modules()}
        self._modules = {}
        for name, weight in weights.items():
            owner = owners.get(id(weight))
            if owner is None:
                raise ValueError(f"weight {name!r} is not the .weight of any module of the model")
            self._modules[name] = owner
        self._sums: dict[str, Tensor] = {}
        self.tokens = 0
        self._handles: list = []

    def __enter__(self) -> InputNorms:
        for name, module in self._modules.items():
            self._handles.append(module.register_forward_hook(self._hook(name)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, name: str):
        def accumulate(module, inputs, output):
            x = inputs[0].detach()
            squares = x.reshape(-1, x.shape[-1]).double().square().sum(0)
            if name in self._sums:
                self._sums[name] += squares
            else:
                self._sums[name] = squares
            if name == next(iter(self._modules)):
                self.tokens += x.numel() // x.shape[-1]

        return accumulate

    def norms(self) -> dict[str, Tensor]:
        missing = [name for name in self._modules if name not in self._sums]
        if missing:
            raise RuntimeError(
                f"no calibration input reached {missing[:4]}: run the model forward inside the `with` block"
            )
        return {name: total.sqrt().float() for name, total in self._sums.items()}
