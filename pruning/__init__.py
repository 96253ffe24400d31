"""Sparsity for any PyTorch training loop: prunable-weight selection, magnitude and N:M
masks, mask bookkeeping, the AC/DC schedule and sparsity statistics. Depends on torch
alone.

    import pruning
    weights = pruning.prunable_parameters(model, "vit")
    sparsifier = pruning.Sparsifier(weights)
    schedule = pruning.ACDCSchedule(100)
    for epoch in range(100):
        action = schedule.action(epoch)
        if action == "prune":
            sparsifier.prune(0.9)
        elif action == "restore":
            sparsifier.restore()
            pruning.reset_optimizer_moments(optimizer, weights)
        ...  # train, with sparsifier.mask_grads_() / .apply_masks_() around optimizer.step()
"""

from .acdc import ACDCSchedule, Phase, reset_optimizer_moments
from .magnitude import SCOPES, apply_masks_, magnitude_masks, prune_
from .masks import Sparsifier
from .nm import nm_masks
from .selection import DEFAULT_EXCLUDE, DEFAULT_MODULE_TYPES, PRESETS, input_dims, prunable_parameters
from .stats import magnitude_histogram, sparsity_stats

__all__ = [
    "ACDCSchedule",
    "DEFAULT_EXCLUDE",
    "DEFAULT_MODULE_TYPES",
    "PRESETS",
    "Phase",
    "SCOPES",
    "Sparsifier",
    "apply_masks_",
    "input_dims",
    "magnitude_histogram",
    "magnitude_masks",
    "nm_masks",
    "prunable_parameters",
    "prune_",
    "reset_optimizer_moments",
    "sparsity_stats",
]
