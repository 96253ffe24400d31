"""Argument checks shared by the optimizers: each raises ``ValueError`` naming the argument."""

from __future__ import annotations

import math

ORDERS = ("ms", "sm")


def check_non_negative(**values: float) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")


def check_betas(betas: tuple[float, float], *, name: str = "betas") -> None:
    if len(betas) != 2:
        raise ValueError(f"{name} must be a pair (beta1, beta2), got {betas!r}")
    for index, value in enumerate(betas):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name}[{index}] must be in [0, 1), got {value}")


def check_order(order: str) -> None:
    if order not in ORDERS:
        raise ValueError(
            f"order must be 'ms' (mirror after steepest descent, the paper's HORST) or "
            f"'sm' (mirror first, the ablation), got {order!r}"
        )
