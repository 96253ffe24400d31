"""Build the optimizer that an `optimizer` config node names, over a model's param groups.

A node is a Hydra `_target_` with `_partial_: true` (lightning-hydra-template's way): every
key but `name` and `hyperbolic_params` is a keyword argument of the class, so adding an
optimizer to the pipelines is one file in `configs/optimizer/`. `name` is the label every table
and record shows, so it must name the class that runs: the class's name in lower case, underscores
aside (`horst_lion` for `horst.HORSTLion`); `optimizer.name=sgd` over `horst.HORST` is refused. This
module is the one place optimizer settings are validated, each problem a one-line `ConfigError`: a key
the class's signature lacks (naming the closest one; an lr-like key names the pipeline's learning rate,
which the schedule drives and the node never holds), the range of the hyperparameters the classes
share (`RANGES`), then the class's own checks.

Param groups follow the usual transformer recipe: decoupled weight decay on tensors with
>= 2 dimensions only (not on biases and norm gains), and not on what the model's timm-style
`no_weight_decay()` names (DeiT's position embedding and class token). `hyperbolic_params` (mirror-step
optimizers only) chooses which tensors take the mirror step (docs/design.md §2.1): `all_2d`
(every tensor with >= 2 dims, HAM's rule; for GPT-2 this includes the tied token embedding)
or `prunable` (only the tensors that will be pruned), passed as the `hyperbolic` group key.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
from collections.abc import Collection, Mapping
from typing import Any

import torch
from omegaconf import OmegaConf

from horst_sparse.training.config import LR_LIKE, ConfigError

HYPERBOLIC_PARAMS = ("all_2d", "prunable")
_NOT_ARGUMENTS = ("name", "hyperbolic_params")  # the pipeline's keys, not the class's
_PIPELINE_LR = "the pipeline's (train.lr, train.base_lr)"  # where the caller names no `lr_key`
# The hyperparameters the classes share, (low, high or None, words): torch's refusals name neither
# the key nor the range ("Invalid epsilon value: -1") and timm's Lion takes a negative decay, so
# they are checked here, for every class alike. betas: each of the two.
RANGES = {
    "eps": (0.0, None, ">= 0"),
    "weight_decay": (0.0, None, ">= 0"),
    "momentum": (0.0, None, ">= 0"),
    "betas": (0.0, 1.0, "two numbers in [0, 1)"),
}


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


def optimizer_factory(node: Mapping[str, Any], *, lr_key: str | None = None) -> functools.partial:
    """The node's class with its arguments bound, its keys and shared ranges checked: call it with
    `(param_groups, lr=...)`. `lr_key` is the pipeline's learning-rate key, named when the node has one."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    resolved = _settings(node)
    settings = {k: v for k, v in resolved.items() if k not in _NOT_ARGUMENTS}
    if "_target_" not in settings:
        raise ConfigError(
            "optimizer has no _target_; every configs/optimizer/*.yaml names its class (e.g. horst.HORST)"
        )
    try:
        factory = instantiate({**settings, "_partial_": True}, _convert_="all")
    except InstantiationException as error:
        raise ConfigError(f"optimizer._target_={settings['_target_']}: {str(error).splitlines()[0]}") from None
    check_label(node)
    _check_keys(resolved, factory.func, lr_key=lr_key)
    _check_ranges(resolved)
    return factory


def _check_keys(settings: Mapping[str, Any], cls: type, *, lr_key: str | None) -> None:
    """Every key of the node is a keyword argument of `cls` or the pipeline's own (`name`,
    `hyperbolic_params`). `lr` never is: the pipeline passes its schedule's lr, which would
    silently win over the node's."""
    parameters = inspect.signature(cls).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    arguments = [k for k, p in parameters.items() if k not in ("params", "lr") and p.kind in keyword]
    known = [*arguments, *_NOT_ARGUMENTS, "_target_", "_partial_"]
    for key in map(str, settings):
        if key == "lr" or (key not in known and LR_LIKE.search(key)):
            raise ConfigError(
                f"optimizer.{key} is not an optimizer setting: the learning rate is {lr_key or _PIPELINE_LR} (> 0)"
            )
        if key not in known and not takes_any:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean optimizer.{close[0]}?" if close else f"it takes {', '.join(arguments)}"
            raise ConfigError(
                f"optimizer={settings.get('name')} ({settings['_target_']}): optimizer.{key} is not a setting of "
                f"the class ({hint}); fix the optimizer.* setting"
            )


def _check_ranges(settings: Mapping[str, Any]) -> None:
    def fits(value: Any, low: float, high: float | None) -> bool:
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return number and value >= low and (high is None or value < high)

    for key, (low, high, words) in RANGES.items():
        if key not in settings:
            continue
        value = settings[key]
        if key == "betas":
            ok = isinstance(value, (list, tuple)) and len(value) == 2 and all(fits(v, low, high) for v in value)
        else:
            ok = fits(value, low, high)
        if not ok:
            raise ConfigError(
                f"optimizer={settings.get('name')} ({settings['_target_']}): optimizer.{key}={value} must be {words}"
            )


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
    lr_key: str | None = None,
    **overrides: Any,
) -> torch.optim.Optimizer:
    """The optimizer of `node` over `model`'s param groups, at learning rate `lr` (the value of the
    pipeline's `lr_key`); `overrides` replace the node's keyword arguments (the engine's,
    `horst_sparse.training.engine.optimizer_overrides`)."""
    settings = {**_settings(node), **overrides}
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
    factory = optimizer_factory(settings, lr_key=lr_key)
    try:
        return factory(groups, lr=lr)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"optimizer={settings.get('name')} ({settings['_target_']}): {error}; fix the optimizer.* setting"
        ) from None


def check_optimizer(node: Mapping[str, Any], *, lr: float, lr_key: str | None = None) -> None:
    """Build the optimizer over one dummy tensor: every check above and the constructor's, before any work."""
    build_optimizer(node, torch.nn.Linear(2, 2), lr=lr, prunable_names=["weight"], lr_key=lr_key)
