"""SGD with momentum as the steepest-descent step: ``HORSTSGD`` (beyond the paper,
docs/design.md §2.3).

The operator composition of Jacobs, Jain, Burkholz (arXiv 2605.21104) with
``torch.optim.SGD`` as the steepest-descent step. With ``u = lr * d`` (``d`` SGD's direction:
gradient, coupled weight decay, momentum, Nesterov):

    theta_new = (theta - u) * exp(-alpha * sign(theta - u) * u - lr * beta)

``order="sm"`` feeds SGD the mirror-scaled gradient ``(1 + alpha * |theta|) * g`` instead
(S∘M) and shrinks by ``exp(-lr * beta)`` before the step. ``alpha = beta = 0`` is
``torch.optim.SGD`` bit for bit on the plain path, with its state (``momentum_buffer`` when
``momentum != 0``). With no momentum and no weight decay the update is HAM's over gradient
descent without its clamp (``u = lr * g``), the setting of HAM's implicit-bias theory. Unlike
Adam's, SGD's step is not bounded: ``alpha * lr * |g|`` must stay well below 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from horst._cpu_kernel import BASE_SGD, BASE_SGD_MOMENTUM, BASE_SGD_NESTEROV
from horst.functional import Descend, Scalars, axpy, scalars
from horst.optimizer import MirrorOptimizer, check_non_negative


def sgd_descend(
    anchor: Tensor, theta: Tensor, g: Tensor, state: tuple[Tensor, ...], s: Scalars
) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """SGD without momentum, as ``torch.optim.SGD`` computes it (the anchor is ``theta``)."""
    d = axpy(g, theta, s.coupled_decay)
    return axpy(anchor, d, s.neg_step_size), d * s.neg_step_size, ()


def sgd_momentum_descend(
    anchor: Tensor, theta: Tensor, g: Tensor, state: tuple[Tensor, ...], s: Scalars
) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """SGD with momentum (and dampening). A new buffer is zeros, with ``buffer_decay = 0`` and
    ``one_minus_dampening = 1``: ``0 * 0 + 1 * d`` is torch's ``d.clone()`` exactly."""
    d = axpy(g, theta, s.coupled_decay)
    buffer = axpy(state[0].to(g.dtype) * s.buffer_decay, d, s.one_minus_dampening)
    return axpy(anchor, buffer, s.neg_step_size), buffer * s.neg_step_size, (buffer,)


def sgd_nesterov_descend(
    anchor: Tensor, theta: Tensor, g: Tensor, state: tuple[Tensor, ...], s: Scalars
) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """SGD with Nesterov momentum."""
    d = axpy(g, theta, s.coupled_decay)
    buffer = axpy(state[0].to(g.dtype) * s.buffer_decay, d, s.one_minus_dampening)
    d = axpy(d, buffer, s.momentum)
    return axpy(anchor, d, s.neg_step_size), d * s.neg_step_size, (buffer,)


class HORSTSGD(MirrorOptimizer):
    """SGD (momentum, dampening, Nesterov, coupled weight decay) + hyperbolic mirror step.

    The group key ``hyperbolic`` and the keywords ``order``, ``maximize``, ``fused``,
    ``foreach``, ``capturable``, ``differentiable`` work as in ``horst.HORST``.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
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
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            nesterov=nesterov,
            weight_decay=weight_decay,
            alpha=alpha,
            beta=beta,
            order=order,
        )
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
        check_non_negative(momentum=group["momentum"])
        if not 0.0 <= group["dampening"] <= 1.0:
            raise ValueError(f"dampening must be in [0, 1], got {group['dampening']}")
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("nesterov requires momentum > 0 and dampening = 0")

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _prepare(self, param: Tensor, state: dict[str, Any], group: dict[str, Any]) -> bool:
        """True at a momentum buffer's first step (torch starts the buffer at the direction itself)."""
        if group["momentum"] == 0 or state.get("momentum_buffer") is not None:
            return False
        state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return True

    def _scalars(
        self, group: dict[str, Any], lr: float | Tensor, first: bool, mirror: tuple[float | Tensor, ...]
    ) -> Scalars:
        alpha_u, alpha_g, lr_beta, clip = mirror
        momentum = group["momentum"]
        return scalars(
            grad_scale=-1.0 if group["maximize"] else 1.0,
            momentum=momentum,
            buffer_decay=0.0 if first else momentum,
            one_minus_dampening=1.0 if first else 1 - group["dampening"],
            coupled_decay=group["weight_decay"],
            neg_step_size=-lr,
            alpha_u=alpha_u,
            alpha_g=alpha_g,
            lr_beta=lr_beta,
            clip=clip,
        )

    def _descend(self, group: dict[str, Any]) -> tuple[Descend, int]:
        if group["momentum"] == 0:
            return sgd_descend, BASE_SGD
        if group["nesterov"]:
            return sgd_nesterov_descend, BASE_SGD_NESTEROV
        return sgd_momentum_descend, BASE_SGD_MOMENTUM
