"""Config schemas shared by the pipelines, and validation of a resolved config before any work.

The dataclasses are Hydra structured-config schemas: a YAML file or an experiment preset
that misspells a key, or gives a string where a number belongs, fails at composition
instead of being silently ignored. `register_shared_configs()` stores them in Hydra's
ConfigStore; each `configs/optimizer/*.yaml` names its schema in its defaults list.
Value checks that a type cannot express (ranges, choices) raise `ConfigError`, which the
entry points print as one line.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, List, Mapping, Optional

from hydra.core.config_store import ConfigStore

from training.optim import HYPERBOLIC_PARAMS, OPTIMIZERS


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the fix."""


@dataclasses.dataclass
class AdamWConfig:
    name: str = "adamw"
    betas: List[float] = dataclasses.field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.01  # decoupled; applied to tensors with >= 2 dims only


@dataclasses.dataclass
class HAMConfig(AdamWConfig):
    name: str = "ham"
    alpha: float = 200.0
    beta: float = 1e-3
    hyperbolic_params: str = "all_2d"  # all_2d | prunable: tensors that take the mirror step


@dataclasses.dataclass
class HORSTConfig(HAMConfig):
    name: str = "horst"
    alpha: float = 10.0
    beta: float = 0.1
    order: str = "ms"  # ms: mirror after the AdamW step (the paper); sm: ablation


@dataclasses.dataclass
class LoggingConfig:
    project: str = "horst"
    mode: Optional[str] = None  # online | offline | disabled; None: $WANDB_MODE, else offline
    name: Optional[str] = None
    group: Optional[str] = None
    tags: List[str] = dataclasses.field(default_factory=list)


def register_shared_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(group="optimizer", name="schema_adamw", node=AdamWConfig)
    cs.store(group="optimizer", name="schema_ham", node=HAMConfig)
    cs.store(group="optimizer", name="schema_horst", node=HORSTConfig)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def validate_optimizer(opt: Mapping[str, Any], *, lr: float, lr_key: str = "train.lr") -> None:
    require(opt["name"] in OPTIMIZERS, f"optimizer.name={opt['name']!r} is unknown; choose one of {', '.join(OPTIMIZERS)}")
    require(lr > 0, f"{lr_key}={lr} must be positive")
    require(opt["eps"] >= 0, f"optimizer.eps={opt['eps']} must be >= 0")
    require(opt["weight_decay"] >= 0, f"optimizer.weight_decay={opt['weight_decay']} must be >= 0")
    betas = list(opt["betas"])
    require(
        len(betas) == 2 and all(0 <= b < 1 for b in betas),
        f"optimizer.betas={betas} must be two numbers in [0, 1)",
    )
    if opt["name"] == "adamw":
        return
    require(opt["alpha"] >= 0, f"optimizer.alpha={opt['alpha']} must be >= 0")
    require(opt["beta"] >= 0, f"optimizer.beta={opt['beta']} must be >= 0")
    require(
        opt["hyperbolic_params"] in HYPERBOLIC_PARAMS,
        f"optimizer.hyperbolic_params={opt['hyperbolic_params']!r} is unknown; use {' or '.join(HYPERBOLIC_PARAMS)}",
    )
    if opt["name"] == "horst":
        require(opt["order"] in ("ms", "sm"), f"optimizer.order={opt['order']!r} is unknown; use ms or sm")


def validate_sparsities(sparsities: Iterable[float], *, key: str) -> None:
    for s in sparsities:
        require(0 <= s < 1, f"{key} has {s}: every sparsity must be in [0, 1)")


def validate_logging(logging: Mapping[str, Any]) -> None:
    require(
        logging["mode"] in (None, "online", "offline", "disabled"),
        f"logging.mode={logging['mode']!r} is unknown; use online, offline, disabled or null ($WANDB_MODE)",
    )
