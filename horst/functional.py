"""The functional core: one step over one tensor, a steepest-descent step composed with the
mirror step, with no optimizer state of its own (docs/design.md §2).

A base optimizer (``horst.adamw``, ``horst.lion``, ``horst.sgd``) supplies a ``descend``
function: from the anchor (``theta`` after decoupled decay), ``theta``, the gradient, its
state tensors and the step's scalars it returns ``(theta_half, -u, new_state)``, adding its
update to the anchor exactly as its plain ``torch.optim`` counterpart does (so that with the
mirror step off the plain path is bit-identical to it). ``mirror_step_`` composes it with the
mirror step in either order:

* "ms" (the paper's HORST, and HAM): ``theta_half = descend(theta * decay)``, then
  ``theta_new = theta_half * exp(clamp(-sign(theta_half) * (alpha_u * u + alpha_g * g) - lr_beta))``
  (``horst.mirror``);
* "sm" (the paper's ablation S∘M, docs/design.md §2.1): the mirror operator acts on the
  gradient, ``g_m = (1 + alpha_u * |theta|) * g``, the base steps with ``g_m``, and beta's
  shrinkage scales the anchor: ``theta_new = descend(theta * decay * exp(-lr_beta), g_m)``.

The same function runs eagerly with Python-float scalars (the plain path) and compiled by
``torch.compile`` with the scalars packed in one tensor (``horst._fast_path``; packing keeps the
kernel from recompiling for every new lr). ``SCALARS`` is the one ordering of the packed
scalars; the C kernel (``_cpu_kernel.c``) takes the same array and its enum lists the same
names in the same order (``tests/test_horst_fast_path.py`` checks).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from horst.mirror import mirror_factor


class Scalars(NamedTuple):
    """A step's scalars, shared by every tensor of a batch. Python floats on the plain path,
    0-d tensors on the compiled path. Each base reads the ones it needs."""

    grad_scale: float  # -1 with maximize=True, else 1
    beta1: float  # Adam / Lion first-moment coefficient
    one_minus_beta1: float
    beta2: float  # Adam second moment; Lion's momentum coefficient
    one_minus_beta2: float
    momentum: float  # SGD (Nesterov's look-ahead)
    buffer_decay: float  # SGD: momentum, 0 on the buffer's first step (torch starts it at d)
    one_minus_dampening: float  # SGD: 1 - dampening, 1 on the buffer's first step
    coupled_decay: float  # SGD's weight decay, added to the gradient
    decay: float  # decoupled weight decay: 1 - lr * weight_decay (AdamW, Lion; 1 for SGD)
    neg_step_size: float  # -lr / (1 - beta1**step) (AdamW), -lr (Lion, SGD)
    bias_correction2_sqrt: float  # sqrt(1 - beta2**step) (AdamW)
    eps: float
    alpha_u: float  # mirror pull by the update (HORST's alpha; S∘M's gradient scale)
    alpha_g: float  # mirror pull by the raw gradient (HAM's lr * alpha)
    lr_beta: float  # lr * beta
    clip: float  # clamp of the mirror exponent (HAM: 5; inf for none)


SCALARS: tuple[str, ...] = Scalars._fields

# descend(anchor, theta, grad, state, scalars) -> (theta_half, neg_update, new_state)
Descend = Callable[[Tensor, Tensor, Tensor, tuple[Tensor, ...], Scalars], tuple[Tensor, Tensor, tuple[Tensor, ...]]]


def scalars(**values: float | Tensor) -> Scalars:
    """A ``Scalars`` with the unused entries at neutral values (1 for the scales, 0 otherwise).
    Values computed from a tensor lr are 0-d tensors, computed in the lr's dtype as
    ``torch.optim.AdamW`` computes them (``1 - lr * weight_decay``, ``lr / (1 - beta1**step)``):
    they are taken as the numbers they hold."""
    neutral = dict.fromkeys(SCALARS, 0.0)
    neutral.update(grad_scale=1.0, decay=1.0, bias_correction2_sqrt=1.0, clip=math.inf)
    neutral.update({name: float(value) for name, value in values.items()})
    return Scalars(**neutral)


def pack(values: Scalars, device: torch.device, dtype: torch.dtype, mirrored: float = math.inf) -> Tensor:
    """The scalars as one tensor in ``SCALARS`` order followed by ``mirrored`` (``mirror_step_``'s
    bound on the indices that take the mirror step; inf: all), the compiled path's argument, in
    the dtype the step computes in (``compute_dtype``): float64 tensors step with float64 scalars."""
    return torch.tensor((*values, mirrored), dtype=dtype).to(device, non_blocking=True)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a step on a tensor of ``dtype`` computes in: float32, or float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def axpy(x: Tensor, y: Tensor, a: float | Tensor) -> Tensor:
    """``x + a * y`` as ``torch.add(x, y, alpha=a)`` computes it (one rounding, as in the plain
    optimizers' ``add_(..., alpha=...)``) when ``a`` is a number; a tensor ``a`` (compiled path)
    is multiplied out."""
    return x + a * y if isinstance(a, Tensor) else torch.add(x, y, alpha=a)


def _exp_scalar(x: float | Tensor) -> float | Tensor:
    return torch.exp(x) if isinstance(x, Tensor) else math.exp(x)


def mirror_step_(
    descend: Descend,
    param: Tensor,
    grad: Tensor,
    state: tuple[Tensor, ...],
    s: Scalars,
    order: str,
    guard: bool,
    mirrored: Tensor | None = None,
) -> None:
    """One step on ``param`` and its ``state`` tensors, in place (see the module docstring).

    Low-precision tensors are computed in float32 and stored back in their own dtype. With
    ``guard`` (HAM's NaN guard) a weight whose new value is not finite keeps its old value.
    ``mirrored`` (1-D tensors, the compiled path's flat batches): only the elements at indices
    below it take the mirror step and the guard; the others take the base's step alone, as
    with the mirror's scalars at 0 (a factor of exactly 1).
    """
    dtype = compute_dtype(param.dtype)
    theta = param.to(dtype)
    g = grad.to(dtype) * s.grad_scale
    mask = None if mirrored is None else torch.arange(param.numel(), device=param.device) < mirrored
    if order == "sm":  # S∘M: the mirror operator scales the gradient, Adam (or Lion, SGD) normalises it
        scaled = g * (1 + s.alpha_u * theta.abs())
        g = scaled if mask is None else torch.where(mask, scaled, g)
        anchor = theta * s.decay
        shrunk = anchor * _exp_scalar(-s.lr_beta)
        anchor = shrunk if mask is None else torch.where(mask, shrunk, anchor)
    else:
        anchor = theta * s.decay
    theta_half, neg_update, new_state = descend(anchor, theta, g, state, s)
    if order == "sm":
        new = theta_half
    else:
        new = theta_half * mirror_factor(theta_half, neg_update, g, s.alpha_u, s.alpha_g, s.lr_beta, s.clip)
        if mask is not None:
            new = torch.where(mask, new, theta_half)
    if guard:
        keep = torch.isfinite(new) if mask is None else torch.isfinite(new) | ~mask
        new = torch.where(keep, new, theta)
    param.copy_(new)
    for tensor, value in zip(state, new_state):
        tensor.copy_(value)
