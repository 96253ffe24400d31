"""Build the optimizer that an `optimizer` config node names, over a model's param groups.

A node is a Hydra `_target_` with `_partial_: true` (lightning-hydra-template's way): every
key but `name` and `hyperbolic_params` is a keyword argument of the class, so adding an
optimizer to the pipelines is one file in `configs/optimizer/`. `name` is the label every table
and record shows, so it must name the class that runs: the class's name in lower case, underscores
aside (`horst_lion` for `horst.HORSTLion`); `optimizer.name=sgd` over `horst.HORST` is refused. The
class checks its own arguments; that is the one place optimizer settings are validated (a bad value or an
unknown key becomes a one-line `ConfigError`).

Param groups follow the usual transformer recipe: decoupled weight decay on tensors with
>= 2 dimensions only (not on biases and norm gains), and not on what the model's timm-style
`no_weight_decay()` names (DeiT's position embedding and class token). `hyperbolic_params` (mirror-step
optimizers only) chooses which tensors take the mirror step (docs/design.md §2.1): `all_2d`
(every tensor with >= 2 dims, HAM's rule; for GPT-2 this includes the tied token embedding)
or `prunable` (only the tensors that will be pruned), passed as the `hyperbolic` group key.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from typing import Any

import torch
from omegaconf import OmegaConf

from horst_sparse.training.config import ConfigError

HYPERBOLIC_PARAMS = ("all_2d", "prunable")
_NOT_ARGUMENTS = ("name", "hyperbolic_params")  # the pipeline's keys, not the class's


def param_groups(
    model: torch.nn.Module,
    *,
    weight_decay: float,
    hyperbolic_names: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """Split parameters by (weight decay, hyperbolic); `hyperbolic_names=None` adds no key.

    Tensors with >= 2 dims are decayed except those the model exempts with timm's
    `no_weight_decay()` (a ViT's `pos_embed` and `cls_token`, as DeiT trains them)."""
    exempt = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    groups: dict[tuple[bool, bool | None], list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decay = param.ndim >= 2 and name not in exempt
        hyperbolic = None if hyperbolic_names is None else name in hyperbolic_names
        groups.setdefault((decay, hyperbolic), []).append(param)
    result = []
    for (decay, hyperbolic), params in groups.items():
        group: dict[str, Any] = {"params": params, "weight_decay": weight_decay if decay else 0.0}
        if hyperbolic is not None:
            group["hyperbolic"] = hyperbolic
        result.append(group)
    return result


def _settings(node: Mapping[str, Any]) -> dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)


def optimizer_factory(node: Mapping[str, Any]) -> functools.partial:
    """The node's class with its arguments bound: call it with `(param_groups, lr=...)`."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    settings = {k: v for k, v in _settings(node).items() if k not in _NOT_ARGUMENTS}
    if "_target_" not in settings:
        raise ConfigError(
            "optimizer has no _target_; every configs/optimizer/*.yaml names its class (e.g. horst.HORST)"
        )
    try:
        factory = instantiate({**settings, "_partial_": True}, _convert_="all")
    except InstantiationException as error:
        raise ConfigError(f"optimizer._target_={settings['_target_']}: {str(error).splitlines()[0]}") from None
    check_label(node)
    return factory


def check_label(node: Mapping[str, Any]) -> None:
    """`optimizer.name` labels every record and table, and picks the tuned values a run reads
    (`tuned_as`): it must be its class's. Reads only `name` and `_target_`, so it runs before the
    rest of the config resolves (a renamed optimizer would first miss its tuned values)."""
    name, target = node.get("name"), str(node.get("_target_"))
    cls = target.rsplit(".", 1)[-1]
    if name is not None and str(name).replace("_", "").lower() != cls.lower():
        raise ConfigError(
            f"optimizer.name={name} but optimizer._target_={target} runs {cls}: choose the optimizer "
            f"with optimizer=<file of configs/optimizer/>, not optimizer.name=; the name is the class's"
        )


def build_optimizer(
    node: Mapping[str, Any],
    model: torch.nn.Module,
    *,
    lr: float,
    prunable_names: Collection[str] = (),
) -> torch.optim.Optimizer:
    """The optimizer of `node` over `model`'s param groups, at learning rate `lr`."""
    settings = _settings(node)
    choice = settings.get("hyperbolic_params")
    if choice is None:
        hyperbolic = None
    elif choice == "all_2d":
        hyperbolic = {n for n, p in model.named_parameters() if p.ndim >= 2}
    elif choice == "prunable":
        hyperbolic = set(prunable_names)
    else:
        raise ConfigError(f"optimizer.hyperbolic_params={choice!r} is unknown; use {' or '.join(HYPERBOLIC_PARAMS)}")
    groups = param_groups(model, weight_decay=settings.get("weight_decay", 0.0), hyperbolic_names=hyperbolic)
    factory = optimizer_factory(settings)
    try:
        return factory(groups, lr=lr)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"optimizer={settings.get('name')} ({settings['_target_']}): {error}; fix the optimizer.* setting"
        ) from None


def check_optimizer(node: Mapping[str, Any], *, lr: float) -> None:
    """Build the optimizer over one dummy tensor: its constructor's checks, before any work."""
    build_optimizer(node, torch.nn.Linear(2, 2), lr=lr, prunable_names=["weight"])
