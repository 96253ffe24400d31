"""Lion as the steepest-descent step: ``HORSTLion`` (beyond the paper, docs/design.md §2.3).

Sign descent is the steepest-descent operator the paper (Jacobs, Jain, Burkholz,
arXiv 2605.21104) uses to model Adam; Lion (Chen et al., 2023, "Symbolic Discovery of
Optimization Algorithms", arXiv 2302.06675) is its practical form. With
``u = lr * sign(beta1 * m + (1 - beta1) * g)``:

    theta_half = theta * (1 - lr * weight_decay) - u
    theta_new  = theta_half * exp(-alpha * sign(theta_half) * u - lr * beta)
    m          = beta2 * m + (1 - beta2) * g

``order="sm"`` feeds Lion the mirror-scaled gradient ``(1 + alpha * |theta|) * g`` instead
(S∘M; the sign erases the scale). ``alpha = beta = 0`` is timm's ``Lion`` bit for bit on the
plain path. The state is Lion's: ``exp_avg``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from horst._cpu_kernel import BASE_LION
from horst.functional import Descend, Scalars, scalars
from horst.optimizer import MirrorOptimizer, check_betas


def lion_descend(
    anchor: Tensor, theta: Tensor, g: Tensor, state: tuple[Tensor, ...], s: Scalars
) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """Lion's step added to ``anchor = theta * (1 - lr * weight_decay)``, as timm's Lion computes it."""
    (exp_avg,) = state
    m = exp_avg.to(g.dtype)
    neg_update = (m * s.beta1 + g * s.one_minus_beta1).sign() * s.neg_step_size  # exact: +-lr or 0
    return anchor + neg_update, neg_update, (m.lerp(g, s.one_minus_beta2),)


class HORSTLion(MirrorOptimizer):
    """Lion (decoupled weight decay) + hyperbolic mirror step.

    Lion's updates have size ``lr`` in every coordinate: use a 3-10x smaller lr than AdamW's.
    The group key ``hyperbolic`` and the keywords ``order``, ``maximize``, ``fused``,
    ``foreach``, ``capturable``, ``differentiable`` work as in ``horst.HORST``.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        alpha: float = 10.0,
        beta: float = 0.0,
        order: str = "ms",
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        fused: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay, alpha=alpha, beta=beta, order=order)
        super().__init__(
            params,
            defaults,
            maximize=maximize,
            foreach=foreach,
            fused=fused,
            capturable=capturable,
            differentiable=differentiable,
        )

    def _check_base(self, group: dict[str, Any]) -> None:
        check_betas(group["betas"])

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg",)

    def _prepare(self, param: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)

    def _scalars(
        self, group: dict[str, Any], lr: float | Tensor, key: Any, mirror: tuple[float | Tensor, ...]
    ) -> Scalars:
        beta1, beta2 = group["betas"]
        alpha_u, alpha_g, lr_beta, clip = mirror
        return scalars(
            grad_scale=-1.0 if group["maximize"] else 1.0,
            beta1=beta1,
            one_minus_beta1=1 - beta1,
            one_minus_beta2=1 - beta2,
            decay=1 - lr * group["weight_decay"],
            neg_step_size=-lr,
            alpha_u=alpha_u,
            alpha_g=alpha_g,
            lr_beta=lr_beta,
            clip=clip,
        )

    def _descend(self, group: dict[str, Any]) -> tuple[Descend, int]:
        return lion_descend, BASE_LION
