"""Sparsity for any PyTorch training loop: prunable-weight selection, magnitude, Wanda and
N:M masks, one-shot pruning by name, mask bookkeeping, the AC/DC schedule, sparsity
statistics and 2:4 sparse kernels on CUDA. Depends on torch alone.

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
from .one_shot import METHODS, UNSTRUCTURED, one_shot_masks, one_shot_prune_, parse_pattern, pattern_sparsity
from .selection import DEFAULT_EXCLUDE, DEFAULT_MODULE_TYPES, PRESETS, input_dims, prunable_parameters
from .semi_structured import conv1d_to_linear_, is_nm_sparse, to_semi_structured_
from .stats import magnitude_histogram, sparsity_stats
from .wanda import InputNorms, wanda_masks, wanda_scores

__all__ = [
    "ACDCSchedule",
    "DEFAULT_EXCLUDE",
    "DEFAULT_MODULE_TYPES",
    "InputNorms",
    "METHODS",
    "PRESETS",
    "Phase",
    "SCOPES",
    "Sparsifier",
    "UNSTRUCTURED",
    "apply_masks_",
    "conv1d_to_linear_",
    "input_dims",
    "is_nm_sparse",
    "magnitude_histogram",
    "magnitude_masks",
    "nm_masks",
    "one_shot_masks",
    "one_shot_prune_",
    "parse_pattern",
    "pattern_sparsity",
    "prunable_parameters",
    "prune_",
    "reset_optimizer_moments",
    "sparsity_stats",
    "to_semi_structured_",
    "wanda_masks",
    "wanda_scores",
]
