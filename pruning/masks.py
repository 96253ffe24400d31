"""Mask bookkeeping for sparse training: prune, keep pruned weights at 0, restore.

AC/DC (Peste et al., "AC/DC: Alternating Compressed/DeCompressed Training of Deep Neural
Networks", NeurIPS 2021) keeps a mask fixed during each compressed phase: pruned weights
are zeroed, their gradients masked, and the mask re-applied after every optimizer step.
Re-applying is what keeps them *exactly* zero: with decoupled weight decay and momentum
(AdamW, HAM, HORST) a masked gradient alone does not stop an optimizer from moving a
weight, since the stored first moment still does.

Typical loop::

    sparsifier = Sparsifier(prunable_parameters(model, "vit"))
    sparsifier.prune(0.9)            # at the start of a compressed phase
    ...
    loss.backward()
    sparsifier.mask_grads_()         # or once: sparsifier.attach(optimizer)
    optimizer.step()
    sparsifier.apply_masks_()
    ...
    sparsifier.restore()             # at the start of a decompressed phase
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ._checks import check_weights
from .one_shot import one_shot_masks


class Sparsifier:
    """Masks (True = kept) over a fixed set of weights ``{name: parameter}``.

    While dense (``masks == {}``), :meth:`mask_grads_` and :meth:`apply_masks_` do
    nothing, so they can be called every step in every phase.
    """

    def __init__(self, weights: Mapping[str, Tensor], *, input_dims: Mapping[str, int] | None = None):
        check_weights(weights)
        self.weights = dict(weights)
        # The input dimension of each weight, for N:M patterns (pruning.input_dims(model,
        # weights)); None: 1 for every weight (nn.Linear [out, in], as in timm's ViT).
        self.input_dims = dict(input_dims) if input_dims is not None else {name: 1 for name in self.weights}
        self.masks: dict[str, Tensor] = {}
        self._pruned: dict[str, Tensor] = {}  # ~mask, kept to avoid inverting every step

    @property
    def is_sparse(self) -> bool:
        return bool(self.masks)

    def prune(self, sparsity: float, *, scope: str = "global", pattern: str = "unstructured") -> dict[str, Tensor]:
        """Compute masks from the current magnitudes (from scratch, ignoring any previous
        mask), zero the pruned weights and return the masks.

        ``pattern="unstructured"``: the smallest ``sparsity`` fraction, over all weights
        (``scope="global"``) or per weight (``"layerwise"``). ``pattern="n:m"`` (e.g.
        ``"2:4"``): the n largest |w| of every m consecutive inputs are kept
        (:func:`pruning.nm_masks` along ``input_dims``); ``sparsity`` must then be 1 - n/m
        and ``scope`` does not apply."""
        masks = one_shot_masks(self.weights, sparsity=sparsity, scope=scope, pattern=pattern, dim=self.input_dims)
        self.set_masks(masks)
        return masks

    def set_masks(self, masks: Mapping[str, Tensor]) -> None:
        """Use given masks (e.g. from :func:`pruning.nm_masks`) for some or all weights,
        and zero the pruned weights."""
        checked = {}
        for name, mask in masks.items():
            if name not in self.weights:
                raise ValueError(f"mask for unknown weight {name!r}; known weights: {sorted(self.weights)[:8]} ...")
            weight = self.weights[name]
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != weight.shape:
                raise ValueError(
                    f"mask for {name!r} must be a bool tensor of shape {tuple(weight.shape)}, got "
                    f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}"
                )
            checked[name] = mask.to(weight.device)
        self.masks = checked
        self._pruned = {name: ~mask for name, mask in checked.items()}
        self.apply_masks_()

    def restore(self) -> None:
        """Drop the masks. Pruned weights stay 0 until the optimizer grows them back."""
        self.masks = {}
        self._pruned = {}

    def mask_grads_(self) -> None:
        """Zero the gradients of pruned weights (call before ``optimizer.step()``)."""
        for name, pruned in self._pruned.items():
            grad = self.weights[name].grad
            if grad is not None:
                grad.masked_fill_(pruned, 0)

    def apply_masks_(self) -> None:
        """Re-zero pruned weights (call after every ``optimizer.step()``)."""
        with torch.no_grad():
            for name, pruned in self._pruned.items():
                self.weights[name].masked_fill_(pruned, 0)

    def attach(self, optimizer: torch.optim.Optimizer) -> _Hooks:
        """Mask gradients before and re-apply masks after every ``optimizer.step()``
        through the optimizer's step hooks. Returns a handle with ``remove()``.

        The pre-step hook runs after any gradient clipping; call :meth:`mask_grads_`
        yourself before clipping if pruned gradients must not count in the norm."""
        return _Hooks(
            optimizer.register_step_pre_hook(lambda *_: self.mask_grads_()),
            optimizer.register_step_post_hook(lambda *_: self.apply_masks_()),
        )

    def state_dict(self) -> dict:
        return {"masks": dict(self.masks)}

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Restore masks saved by :meth:`state_dict` (``{}`` = dense) and zero the
        pruned weights."""
        if "masks" not in state_dict:
            raise ValueError("state_dict has no 'masks' entry; pass what Sparsifier.state_dict() returned")
        if state_dict["masks"]:
            self.set_masks(state_dict["masks"])
        else:
            self.restore()


class _Hooks:
    def __init__(self, *handles):
        self._handles = handles

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
