"""HORST over Lion: the mirror step composed with sign descent.

Beyond the paper (DESIGN §2.3): sign descent is the steepest-descent operator the paper
(Jacobs, Jain, Burkholz, arXiv 2605.21104) uses to model Adam; Lion (Chen et al., 2023,
"Symbolic Discovery of Optimization Algorithms", arXiv 2302.06675) is its practical form.
With ``u = lr * sign(beta1 * m + (1 - beta1) * g)``:

    theta_half = theta * (1 - lr * weight_decay) - u
    theta_new  = theta_half * exp(-alpha * sign(theta_half) * u - lr * beta)
    m          = beta2 * m + (1 - beta2) * g

``alpha = beta = 0`` is plain Lion.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer

from horst._validation import check_betas, check_non_negative, check_order
from horst.functional import MirrorCoefficients, lion_mirror_tensor_
from horst.mirror import NO_CLIP


class HORSTLion(Optimizer):
    """Lion (decoupled weight decay) + hyperbolic mirror step.

    Lion's updates have size ``lr`` in every coordinate: use a 3-10x smaller lr than
    AdamW's. The group key ``hyperbolic`` works as in ``horst.HORST``.
    """

    def __init__(
        self,
        params: Iterable[Any],
        *,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        alpha: float = 10.0,
        beta: float = 0.0,
        order: str = "ms",
    ) -> None:
        check_non_negative(lr=lr, weight_decay=weight_decay, alpha=alpha, beta=beta)
        check_betas(betas)
        check_order(order)
        defaults = dict(
            lr=lr, betas=tuple(betas), weight_decay=weight_decay,
            alpha=alpha, beta=beta, order=order, hyperbolic=None,
        )  # fmt: skip
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            mirror = MirrorCoefficients(group["alpha"], 0.0, group["lr"] * group["beta"], NO_CLIP)
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                hyperbolic = param.ndim >= 2 if group["hyperbolic"] is None else group["hyperbolic"]
                lion_mirror_tensor_(
                    param, param.grad, state["exp_avg"],
                    lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
                    mirror=mirror if hyperbolic else MirrorCoefficients.none(),
                    mirror_first=group["order"] == "sm",
                )  # fmt: skip
        return loss
