"""Which weights of a model are prunable.

Magnitude pruning of transformers (Han et al., "Learning both Weights and Connections
for Efficient Neural Networks", NeurIPS 2015; Zhu & Gupta, "To prune, or not to prune",
2017) and AC/DC (Peste et al., NeurIPS 2021) sparsify the weights of the linear maps
inside the transformer blocks; embeddings, heads, norms, biases and the patch embedding
stay dense. Sparsity is reported over this prunable set.

The selection is by module: a module qualifies when its type is one of ``module_types``
and its name (as in ``model.named_modules()``) matches one of the regex ``patterns``
(``re.search``) and none of the ``exclude`` patterns; its ``weight`` is then prunable.
HF GPT-2's block matrices are ``transformers.pytorch_utils.Conv1D`` (weight shape
[in, out]); they are recognised by class name, so this module does not import
transformers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

# Names are matched with re.search, so a prefix such as DDP's "module." or
# torch.compile's "_orig_mod." does not get in the way.
PRESETS: dict[str, list[str]] = {
    # timm VisionTransformer (ViT and DeiT): the four matrices of every block.
    "vit": [
        r"(^|\.)blocks\.\d+\.attn\.qkv$",
        r"(^|\.)blocks\.\d+\.attn\.proj$",
        r"(^|\.)blocks\.\d+\.mlp\.fc1$",
        r"(^|\.)blocks\.\d+\.mlp\.fc2$",
    ],
    # HF GPT2Model / GPT2LMHeadModel: the four Conv1D matrices of every block.
    "gpt2": [
        r"(^|\.)h\.\d+\.attn\.c_attn$",
        r"(^|\.)h\.\d+\.attn\.c_proj$",
        r"(^|\.)h\.\d+\.mlp\.c_fc$",
        r"(^|\.)h\.\d+\.mlp\.c_proj$",
    ],
}
PRESETS["deit"] = PRESETS["vit"]  # timm's DeiT models are VisionTransformers

# Modules whose weights are never pruned unless the caller passes its own `exclude`:
# classification/LM heads and patch/stem embeddings.
DEFAULT_EXCLUDE: tuple[str, ...] = (
    r"(^|\.)(head|head_dist|heads|lm_head|classifier|pre_logits)(\.|$)",
    r"(^|\.)(patch_embed|stem)(\.|$)",
)

# "Conv1D" is HF transformers' transposed linear layer, matched by class name.
DEFAULT_MODULE_TYPES: tuple[type | str, ...] = (nn.Linear, nn.Conv2d, "Conv1D")

_NAME_SAMPLE = 12


def prunable_parameters(
    model: nn.Module,
    preset: str | None = None,
    *,
    patterns: Sequence[str] | None = None,
    module_types: Iterable[type | str] | None = None,
    exclude: Sequence[str] | None = None,
) -> dict[str, nn.Parameter]:
    """Return the prunable weights of ``model`` as ``{parameter name: weight}``.

    Args:
        model: any ``nn.Module``.
        preset: a key of :data:`PRESETS` (``"vit"``, ``"deit"``, ``"gpt2"``).
        patterns: regexes on module names, added to the preset's. With neither a preset
            nor patterns, every module of ``module_types`` qualifies.
        module_types: module classes, or class names as strings (matched anywhere in the
            class hierarchy), whose ``weight`` may be pruned. Default: ``nn.Linear``,
            ``nn.Conv2d`` and HF ``Conv1D``.
        exclude: regexes on module names that are never pruned. Default
            :data:`DEFAULT_EXCLUDE` (heads and patch embeddings); pass ``()`` to
            exclude nothing.

    Names are those of ``model.named_parameters()`` (a tied weight appears once, under
    its first name), in module order. Raises ``ValueError`` when nothing matches.
    """
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is unknown; choose one of {sorted(PRESETS)} or pass patterns=")
    include = list(PRESETS[preset]) if preset is not None else []
    include += list(patterns or [])
    include_res = [_compile(p, "patterns") for p in include]
    exclude_res = [_compile(p, "exclude") for p in (DEFAULT_EXCLUDE if exclude is None else exclude)]
    types = tuple(DEFAULT_MODULE_TYPES if module_types is None else module_types)
    if not types:
        raise ValueError("module_types is empty; pass module classes or class names such as 'Conv1D'")

    param_names = {id(p): name for name, p in model.named_parameters()}
    selected: dict[str, nn.Parameter] = {}
    for module_name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, nn.Parameter) or weight.ndim < 2 or id(weight) not in param_names:
            continue
        if not _is_instance(module, types):
            continue
        if include_res and not any(r.search(module_name) for r in include_res):
            continue
        if any(r.search(module_name) for r in exclude_res):
            continue
        selected.setdefault(param_names[id(weight)], weight)

    if not selected:
        raise ValueError(_nothing_matched(model, preset, include, exclude_res, types))
    return selected


def input_dims(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """The input dimension of each weight, for N:M masks: 0 for HF ``Conv1D`` (weight
    [in, out]), 1 for everything else (``nn.Linear`` [out, in], ``nn.Conv2d``
    [out, in, kh, kw])."""
    owners = {id(getattr(m, "weight", None)): m for m in model.modules()}
    dims = {}
    for name, weight in weights.items():
        owner = owners.get(id(weight))
        if owner is None:
            raise ValueError(f"weight {name!r} is not the .weight of any module of the model")
        dims[name] = 0 if _is_instance(owner, ("Conv1D",)) else 1
    return dims


def _is_instance(module: nn.Module, types: tuple[type | str, ...]) -> bool:
    class_names = {cls.__name__ for cls in type(module).__mro__}
    return any(t in class_names if isinstance(t, str) else isinstance(module, t) for t in types)


def _compile(pattern: str, argument: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise ValueError(f"{argument}: {pattern!r} is not a valid regex ({err})") from None


def _nothing_matched(model, preset, include, exclude_res, types) -> str:
    names = [name for name, _ in model.named_parameters()]
    sample = names[:_NAME_SAMPLE]
    more = f" ... ({len(names)} in all)" if len(names) > len(sample) else ""
    type_names = [t if isinstance(t, str) else t.__name__ for t in types]
    return (
        f"prunable_parameters selected nothing: preset={preset!r}, patterns={include}, "
        f"exclude={[r.pattern for r in exclude_res]}, module_types={type_names}. "
        f"Patterns are regexes on module names (parameter name without '.weight'). "
        f"The model's parameters include: {sample}{more}"
    )
