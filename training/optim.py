"""Build AdamW, HAM or HORST from an `optimizer` config node.

Parameter groups follow the usual transformer recipe: decoupled weight decay on tensors
with >= 2 dimensions only (not on biases and norm gains). For HAM and HORST the config's
`hyperbolic_params` chooses which tensors get the mirror step (DESIGN §2.1):
`all_2d` (every tensor with >= 2 dims, HAM's rule; for GPT-2 this includes the tied token
embedding) or `prunable` (only the tensors that will be pruned). It is passed to the
optimizer through the `hyperbolic` param-group key.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

import torch

OPTIMIZERS = ("adamw", "ham", "horst")
HYPERBOLIC_PARAMS = ("all_2d", "prunable")


def param_groups(
    model: torch.nn.Module,
    *,
    weight_decay: float,
    hyperbolic_names: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """Split parameters by (weight decay, hyperbolic); `hyperbolic_names=None` adds no key."""
    groups: dict[tuple[bool, bool | None], list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decay = param.ndim >= 2
        hyperbolic = None if hyperbolic_names is None else name in hyperbolic_names
        groups.setdefault((decay, hyperbolic), []).append(param)
    result = []
    for (decay, hyperbolic), params in groups.items():
        group: dict[str, Any] = {"params": params, "weight_decay": weight_decay if decay else 0.0}
        if hyperbolic is not None:
            group["hyperbolic"] = hyperbolic
        result.append(group)
    return result


def build_optimizer(
    cfg: Mapping[str, Any],
    model: torch.nn.Module,
    *,
    lr: float,
    prunable_names: Collection[str] = (),
) -> torch.optim.Optimizer:
    """`cfg` is the `optimizer` config node: name, betas, eps, weight_decay and, for HAM and
    HORST, alpha, beta, hyperbolic_params (HORST also `order`)."""
    name = cfg["name"]
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    common = dict(lr=lr, betas=tuple(cfg["betas"]), eps=cfg["eps"], weight_decay=cfg["weight_decay"])
    on_accelerator_or_cpu = all(p.device.type in ("cpu", "cuda") for p in model.parameters())
    if name == "adamw":
        groups = param_groups(model, weight_decay=cfg["weight_decay"])
        return torch.optim.AdamW(groups, **common, fused=on_accelerator_or_cpu)

    import horst

    if cfg["hyperbolic_params"] == "all_2d":
        hyperbolic = {n for n, p in model.named_parameters() if p.ndim >= 2}
    elif cfg["hyperbolic_params"] == "prunable":
        hyperbolic = set(prunable_names)
    else:
        raise ValueError(
            f"unknown optimizer.hyperbolic_params {cfg['hyperbolic_params']!r}; use {' or '.join(HYPERBOLIC_PARAMS)}"
        )
    groups = param_groups(model, weight_decay=cfg["weight_decay"], hyperbolic_names=hyperbolic)
    if name == "ham":
        return horst.HAM(groups, **common, alpha=cfg["alpha"], beta=cfg["beta"])
    return horst.HORST(groups, **common, alpha=cfg["alpha"], beta=cfg["beta"], order=cfg["order"])

