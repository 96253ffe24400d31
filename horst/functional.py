"""Functional cores of the optimizers: per-tensor updates with no optimizer state of their own.

The AdamW-based step (HORST, HAM) is one elementwise function, ``adamw_mirror_tensor_``,
that runs either eagerly (the plain path) or compiled into a single fused kernel by
``torch.compile`` (the fast path, see ``horst._fast_path``). Both paths execute the very
same code, so they cannot drift apart.

The AdamW part follows ``torch.optim.AdamW``'s single-tensor implementation operation by
operation, so that with the mirror step switched off the plain path is bit-identical to it.
See DESIGN §2 and the module docstring of ``horst.mirror`` for the mirror step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from horst.mirror import mirror_factor


@dataclass(frozen=True)
class MirrorCoefficients:
    """Per-group coefficients of the mirror step (see ``horst.mirror``)."""

    alpha_u: float  # weight of the steepest-descent update u (HORST's alpha)
    alpha_g: float  # weight of the raw gradient g (HAM's lr * alpha)
    lr_beta: float  # lr * beta
    clip: float  # exponent clamp, inf for none

    @staticmethod
    def none() -> "MirrorCoefficients":
        return MirrorCoefficients(0.0, 0.0, 0.0, float("inf"))


# Order of the scalars packed into one tensor for ``adamw_mirror_tensor_``. Packing them
# keeps the compiled kernel from specialising (and recompiling) on every new lr value.
ADAMW_SCALARS = (
    "one_minus_beta1", "beta2", "one_minus_beta2", "decay", "neg_step_size",
    "bias_correction2_sqrt", "eps", "alpha_u", "alpha_g", "lr_beta", "clip",
)  # fmt: skip


def adamw_mirror_values(
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
    mirror: MirrorCoefficients,
) -> dict[str, float]:
    """The step's scalars, by the names of ``ADAMW_SCALARS``."""
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    values = (
        1 - beta1,
        beta2,
        1 - beta2,
        1 - lr * weight_decay,
        -(lr / bias_correction1),
        bias_correction2**0.5,
        eps,
        mirror.alpha_u,
        mirror.alpha_g,
        mirror.lr_beta,
        mirror.clip,
    )
    return dict(zip(ADAMW_SCALARS, values))


def adamw_mirror_scalars(values: dict[str, float], device: torch.device) -> Tensor:
    """Pack the step's scalars as ``adamw_mirror_tensor_`` expects them (float32)."""
    packed = [values[name] for name in ADAMW_SCALARS]
    return torch.tensor(packed, dtype=torch.float32).to(device, non_blocking=True)


def adamw_mirror_tensor_(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    scalars: Tensor,
    mirror_first: bool,
) -> None:
    """One AdamW step followed (order "ms") or preceded (order "sm") by the mirror step.

    Updates ``param``, ``exp_avg`` and ``exp_avg_sq`` in place. Low-precision tensors are
    computed in float32 and stored back in their own dtype.
    """
    (one_minus_beta1, beta2, one_minus_beta2, decay, neg_step_size,
     bias_correction2_sqrt, eps, alpha_u, alpha_g, lr_beta, clip) = scalars.unbind()  # fmt: skip
    compute_dtype = torch.promote_types(param.dtype, torch.float32)
    theta = param.to(compute_dtype)
    g = grad.to(compute_dtype)

    m = exp_avg.to(compute_dtype).lerp(g, one_minus_beta1)
    # addcmul, as torch's AdamW: its scalar tail may contract to an FMA, a mul + add cannot
    v = torch.addcmul(exp_avg_sq.to(compute_dtype) * beta2, one_minus_beta2 * g, g)
    denom = v.sqrt() / bias_correction2_sqrt + eps
    neg_update = neg_step_size * m / denom  # -u, u = Adam(g, lr)

    if mirror_first:  # "sm": mirror at theta, then AdamW (the paper's ablation)
        theta = theta * mirror_factor(theta, neg_update, g, alpha_u, alpha_g, lr_beta, clip)
        theta = theta * decay + neg_update
    else:  # "ms": AdamW, then mirror at theta_half (HORST, HAM)
        theta_half = theta * decay + neg_update
        theta = theta_half * mirror_factor(
            theta_half, neg_update, g, alpha_u, alpha_g, lr_beta, clip
        )

    param.copy_(theta)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)


def sgd_mirror_tensor_(
    param: Tensor,
    grad: Tensor,
    momentum_buffer: Tensor | None,
    *,
    lr: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    weight_decay: float,
    mirror: MirrorCoefficients,
    mirror_first: bool,
) -> Tensor | None:
    """``torch.optim.SGD``'s step (coupled weight decay, momentum, Nesterov) composed with
    the mirror step. Returns the momentum buffer (created on the first step)."""
    direction = grad.add(param, alpha=weight_decay) if weight_decay != 0 else grad
    if momentum != 0:
        if momentum_buffer is None:
            momentum_buffer = direction.detach().clone()
        else:
            momentum_buffer.mul_(momentum).add_(direction, alpha=1 - dampening)
        direction = direction.add(momentum_buffer, alpha=momentum) if nesterov else momentum_buffer
    _descend_and_mirror_(param, direction, grad, lr=lr, decay=1.0, mirror=mirror, mirror_first=mirror_first)
    return momentum_buffer


def lion_mirror_tensor_(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    mirror: MirrorCoefficients,
    mirror_first: bool,
) -> None:
    """Lion's sign-descent step (Chen et al., 2023, "Symbolic Discovery of Optimization
    Algorithms") with decoupled weight decay, composed with the mirror step."""
    direction = exp_avg.lerp(grad, 1 - beta1).sign_()
    exp_avg.lerp_(grad, 1 - beta2)
    _descend_and_mirror_(
        param, direction, grad, lr=lr, decay=1 - lr * weight_decay, mirror=mirror, mirror_first=mirror_first
    )


def _descend_and_mirror_(
    param: Tensor,
    direction: Tensor,
    grad: Tensor,
    *,
    lr: float,
    decay: float,
    mirror: MirrorCoefficients,
    mirror_first: bool,
) -> None:
    """``param <- param * decay - lr * direction`` with the mirror step after it ("ms") or
    before it ("sm"). The descent is written as the plain optimizers write it, so that a
    zero mirror step reproduces them exactly."""
    coefficients = (mirror.alpha_u, mirror.alpha_g, mirror.lr_beta, mirror.clip)
    neg_update = direction.mul(-lr)
    if mirror_first:
        param.mul_(mirror_factor(param, neg_update, grad, *coefficients))
    param.mul_(decay).add_(direction, alpha=-lr)
    if not mirror_first:
        param.mul_(mirror_factor(param, neg_update, grad, *coefficients))
