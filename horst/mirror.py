"""The hyperbolic-entropy mirror step shared by every optimizer in this package
(docs/design.md §2.1, §2.2).

HORST (Jacobs, Jain, Burkholz, "HORST: Composing Optimizer Geometries for Sparse
Transformer Training", arXiv 2605.21104) and HAM (Jacobs et al., ICLR 2026,
arXiv 2506.02630) both finish a step with a multiplicative update

    theta_new = theta_anchor * exp(clamp(-sign(theta_anchor) * x - lr * beta, -clip, clip))

that follows from the hyperbolic-entropy mirror map. They differ only in what ``x`` is:

* HORST: ``x = alpha * u``, the steepest-descent update itself (Adam's, Lion's, SGD's),
  with no clamp;
* HAM:   ``x = lr * alpha * g``, the raw gradient, clamped to +-5.

Writing both as ``x = alpha_u * u + alpha_g * g`` lets one elementwise kernel serve both.
Tensors that do not take the mirror step use ``alpha_u = alpha_g = lr_beta = 0``, for which
the factor is exactly 1. Order "sm" (S∘M, docs/design.md §2.1) does not use this factor: it
scales the gradient by ``1 + alpha * |theta|`` before the steepest-descent step
(``horst.functional.mirror_step_``).

The exponential is evaluated by ``exp_float32`` below rather than ``torch.exp``: inductor's
CPU code calls SLEEF's ``expf8_u10``, which made the fused step compute-bound and ~2x
slower than ``torch.optim.AdamW(fused=True)``; the polynomial here keeps the step
memory-bound (``bench/optimizer_step.py``) at 2e-7 worst-case relative error, and
``exp_float32(0) == 1`` exactly. The CPU kernel (``_cpu_kernel.c``) uses the same polynomial.
Float64 tensors (the toy experiment) use ``torch.exp``.
"""

from __future__ import annotations

import torch
from torch import Tensor

LOG2_E = 1.4426950408889634
# ln(2) split in a part exact in float32 and a remainder (Cody & Waite range reduction).
LN2_HIGH = 0.693145751953125
LN2_LOW = 1.428606765330187045e-06
# exp(x) overflows float32 above ~88.7 and underflows below ~-87.3 (normal range). Ints, exact as
# floats: torch.compile(dynamic=True) makes a global float a symbolic input, and a symbolic clamp
# bound restarts its analysis (a second trace of the whole step).
EXP_ARG_MIN, EXP_ARG_MAX = -87, 88
# exp(r) ~ 1 + r + c2 r^2 + c3 r^3 + c4 r^4 + c5 r^5 on |r| <= ln(2) / 2: coefficients fitted
# for least maximum relative error (1.0e-7 in exact arithmetic, 1.8e-7 evaluated in float32;
# the degree-6 Taylor polynomial needs one more multiply-add for 2.4e-7).
EXP_POLY = (0.4999923177571429, 0.16667114472984093, 0.041890115202198576, 0.008312524894683274)

HAM_EXPONENT_CLIP = 5.0  # HAM clamps the exponent to +-5; HORST does not clamp (inf)


def mirror_factor(
    anchor: Tensor,
    neg_update: Tensor,
    grad: Tensor,
    alpha_u: Tensor | float,
    alpha_g: Tensor | float,
    lr_beta: Tensor | float,
    clip: Tensor | float,
) -> Tensor:
    """``exp(clamp(-sign(anchor) * (alpha_u * u + alpha_g * g) - lr_beta, -clip, clip))``.

    ``neg_update`` is ``-u`` (the increment the steepest-descent step adds), which is the
    quantity the optimizers already hold; ``anchor`` is the tensor whose sign decides the
    direction of the pull towards zero (theta_half for order "ms", theta for "sm").
    """
    sign = torch.sign(anchor)
    exponent = sign * (alpha_u * neg_update - alpha_g * grad) - lr_beta
    return exp(torch.clamp(exponent, -clip, clip))


def exp(x: Tensor) -> Tensor:
    """``exp_float32`` for float32 (and lower precision computed in float32), ``torch.exp`` for float64."""
    return torch.exp(x) if x.dtype == torch.float64 else exp_float32(x)


def exp_float32(x: Tensor) -> Tensor:
    """``exp(x)`` for float32 ``x``, saturating to exp(-87) and exp(88) outside that range.

    ``exp(x) = 2**k * exp(r)`` with ``k = round(x / ln 2)`` and ``|r| <= ln(2) / 2``;
    ``exp(r)`` by the degree-5 polynomial ``EXP_POLY``, ``2**k`` by writing ``k`` into the
    float exponent bits. NaN in, garbage out: callers multiply by a NaN anchor anyway.
    """
    x = torch.clamp(x, EXP_ARG_MIN, EXP_ARG_MAX)
    k = torch.floor(x * LOG2_E + 0.5)
    r = (x - k * LN2_HIGH) - k * LN2_LOW
    c2, c3, c4, c5 = EXP_POLY
    poly = 1.0 + r * (1.0 + r * (c2 + r * (c3 + r * (c4 + r * c5))))
    # bitwise_left_shift, not <<: on a DTensor (torch 2.14) << leaves the bits where they are
    two_to_k = torch.bitwise_left_shift(k.to(torch.int32) + 127, 23).view(torch.float32)
    return poly * two_to_k
