"""HORST over SGD with momentum: the mirror step composed with plain steepest descent.

Beyond the paper (DESIGN §2.3): the operator composition of Jacobs, Jain, Burkholz
(arXiv 2605.21104) with ``torch.optim.SGD`` as the steepest-descent step. With
``u = lr * d`` (``d`` SGD's direction: gradient, coupled weight decay, momentum, Nesterov):

    theta_new = (theta - u) * exp(-alpha * sign(theta - u) * u - lr * beta)

``alpha = beta = 0`` is exactly ``torch.optim.SGD``. With no momentum and no weight decay
the update is HAM's over gradient descent without its clamp (``u = lr * g``), the setting
of HAM's implicit-bias theory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer

from horst._validation import check_non_negative, check_order
from horst.functional import MirrorCoefficients, sgd_mirror_tensor_
from horst.mirror import NO_CLIP


class HORSTSGD(Optimizer):
    """SGD (momentum, dampening, Nesterov, coupled weight decay) + hyperbolic mirror step.

    The group key ``hyperbolic`` works as in ``horst.HORST``.
    """

    def __init__(
        self,
        params: Iterable[Any],
        *,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        alpha: float = 10.0,
        beta: float = 0.0,
        order: str = "ms",
    ) -> None:
        check_non_negative(lr=lr, momentum=momentum, weight_decay=weight_decay, alpha=alpha, beta=beta)
        if not 0.0 <= dampening <= 1.0:
            raise ValueError(f"dampening must be in [0, 1], got {dampening}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov requires momentum > 0 and dampening = 0")
        check_order(order)
        defaults = dict(
            lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
            weight_decay=weight_decay, alpha=alpha, beta=beta, order=order, hyperbolic=None,
        )  # fmt: skip
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            mirror = MirrorCoefficients(group["alpha"], 0.0, group["lr"] * group["beta"], NO_CLIP)
            for param in group["params"]:
                if param.grad is None:
                    continue
                hyperbolic = param.ndim >= 2 if group["hyperbolic"] is None else group["hyperbolic"]
                state = self.state[param]
                buffer = sgd_mirror_tensor_(
                    param, param.grad, state.get("momentum_buffer"),
                    lr=group["lr"], momentum=group["momentum"], dampening=group["dampening"],
                    nesterov=group["nesterov"], weight_decay=group["weight_decay"],
                    mirror=mirror if hyperbolic else MirrorCoefficients.none(),
                    mirror_first=group["order"] == "sm",
                )  # fmt: skip
                if buffer is not None:
                    state["momentum_buffer"] = buffer
        return loss
