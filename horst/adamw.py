"""AdamW as the steepest-descent step: ``HORST`` (the paper's optimizer) and ``HAM`` (its baseline).

Both keep exactly ``torch.optim.AdamW``'s state (``step``, ``exp_avg``, ``exp_avg_sq``), so AdamW
checkpoints load into them and back; they differ in the mirror step (docs/design.md §2.1, §2.2).
With ``u = Adam(g, lr)`` (bias-corrected, lr included):

* HORST: ``theta_half = theta * (1 - lr * weight_decay) - u``,
  ``theta_new = theta_half * exp(-alpha * sign(theta_half) * u - lr * beta)``
  (Jacobs, Jain, Burkholz, "HORST: Composing Optimizer Geometries for Sparse Transformer
  Training", arXiv 2605.21104). ``order="sm"`` is the paper's ablation S∘M: Adam is fed the
  mirror-scaled gradient ``(1 + alpha * |theta|) * g`` and
  ``theta_new = theta * (1 - lr * weight_decay) * exp(-lr * beta) - Adam(g_m, lr)``; Adam's
  normalisation cancels the scale, and with it the sparsity bias.
* HAM: ``theta_new = theta_half * exp(clamp(lr * (-alpha * sign(theta_half) * g - beta), -5, 5))``
  with the raw gradient ``g`` (Jacobs et al., "Hyperbolic Aware Minimization", ICLR 2026,
  arXiv 2506.02630), plus the two guards of the authors' reference wrapper (TomJacobs05/HAM): a
  NaN guard and a per-tensor norm cap of 1000 on every parameter with a gradient.

``alpha = beta = 0`` is ``torch.optim.AdamW`` bit for bit on the plain path.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

from horst._cpu_kernel import BASE_ADAMW
from horst.functional import Descend, Scalars, scalars
from horst.mirror import HAM_EXPONENT_CLIP
from horst.optimizer import MirrorOptimizer, check_betas, check_non_negative


def adamw_descend(
    anchor: Tensor, theta: Tensor, g: Tensor, state: tuple[Tensor, ...], s: Scalars
) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """AdamW's step added to ``anchor = theta * (1 - lr * weight_decay)``, operation by operation
    as ``torch.optim.AdamW``'s single-tensor implementation computes it."""
    exp_avg, exp_avg_sq = state
    m = exp_avg.to(g.dtype).lerp(g, s.one_minus_beta1)
    # addcmul, as torch's AdamW: its scalar tail may contract to an FMA, a mul + add cannot
    v = torch.addcmul(exp_avg_sq.to(g.dtype) * s.beta2, s.one_minus_beta2 * g, g)
    denom = v.sqrt() / s.bias_correction2_sqrt + s.eps
    neg_update = s.neg_step_size * m / denom  # -u, u = Adam(g, lr)
    return anchor + neg_update, neg_update, (m, v)


class _AdamWBase(MirrorOptimizer):
    """AdamW composed with a mirror step: state, scalars and descent shared by HORST and HAM."""

    def _check_base(self, group: dict[str, Any]) -> None:
        check_non_negative(eps=group["eps"])
        check_betas(group["betas"])

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def _prepare(self, param: Tensor, state: dict[str, Any], group: dict[str, Any]) -> int:
        if not state:  # exactly torch.optim.AdamW's state; a loaded step is a CPU tensor (__setstate__)
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        step = state["step"]
        # counts as torch's `step += 1` does (in the step's dtype), at a third of its host cost;
        # read on the CPU: no sync
        return int(step.fill_(step.item() + 1).item())

    def _scalars(
        self, group: dict[str, Any], lr: float | Tensor, step: int, mirror: tuple[float | Tensor, ...]
    ) -> Scalars:
        beta1, beta2 = group["betas"]
        alpha_u, alpha_g, lr_beta, clip = mirror
        return scalars(
            grad_scale=-1.0 if group["maximize"] else 1.0,
            one_minus_beta1=1 - beta1,
            beta2=beta2,
            one_minus_beta2=1 - beta2,
            decay=1 - lr * group["weight_decay"],
            neg_step_size=-(lr / (1 - beta1**step)),
            bias_correction2_sqrt=math.sqrt(1 - beta2**step),
            eps=group["eps"],
            alpha_u=alpha_u,
            alpha_g=alpha_g,
            lr_beta=lr_beta,
            clip=clip,
        )

    def _descend(self, group: dict[str, Any]) -> tuple[Descend, int]:
        return adamw_descend, BASE_ADAMW


class HORST(_AdamWBase):
    """Hyperbolic Operator for Robust Sparse Training over AdamW (see the module docstring).

    Args:
        params: parameters or param groups. A group may set ``hyperbolic`` (bool) to choose
            whether its tensors take the mirror step; by default tensors with ``ndim >= 2`` do
            and the others get plain AdamW.
        lr (float or tensor), betas, eps, weight_decay, maximize: as in ``torch.optim.AdamW``.
        alpha: strength of the mirror step (the L1 bias); 0 turns it off.
        beta: extra multiplicative shrinkage, ``exp(-lr * beta)`` per step.
        order: ``"ms"`` (the paper's HORST) or ``"sm"`` (the ablation S∘M).
        fused: ``True`` for the fast path (a C kernel for float32 on CPU, a ``torch.compile``d
            kernel otherwise; ``horst._fast_path``), ``False`` for the plain path, ``None``
            (default) for the fast path unless the environment sets ``HORST_FUSED=0``.
        foreach, capturable, differentiable: accepted as ``None``/``False`` (``ValueError``
            otherwise, naming the alternative).

    Keep ``alpha * lr`` well below 1: each step scales a weight by about ``exp(+-alpha * |u|)``
    with ``|u|`` up to a few ``lr``. The defaults ``alpha=10, beta=0.1`` are ours (the paper's
    values are not public).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        alpha: float = 10.0,
        beta: float = 0.1,
        order: str = "ms",
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        fused: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, alpha=alpha, beta=beta, order=order
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


class HAM(_AdamWBase):
    """AdamW, then HAM's gradient-driven hyperbolic step on hyperbolic tensors.

    Args are those of ``horst.HORST`` without ``order`` (HAM always mirrors after AdamW), and:
        max_norm: per-tensor cap on the L2 norm of every parameter with a gradient after the
            step (a tensor above it is rescaled to it); ``None``: no cap. Default 1000, the
            reference wrapper's ``max_weight_norm``.
        nan_guard: where a hyperbolic tensor's step gives a non-finite value, the weight keeps
            its old value (default ``True``).

    Defaults are the authors' (ImageNet, and their public wrapper, TomJacobs05/HAM):
    ``alpha=200, beta=1e-3, max_norm=1000``. Zeros stay zero. Where ours differs from the wrapper:
    docs/design.md §2.2.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        alpha: float = 200.0,
        beta: float = 1e-3,
        *,
        max_norm: float | None = 1000.0,
        nan_guard: bool = True,
        maximize: bool = False,
        foreach: bool | None = None,
        fused: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            alpha=alpha,
            beta=beta,
            max_norm=max_norm,
            nan_guard=nan_guard,
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
        super()._check_base(group)
        if group["max_norm"] is not None:
            check_non_negative(max_norm=group["max_norm"])
        if not isinstance(group["nan_guard"], bool):
            raise ValueError(f"nan_guard must be a bool, got {group['nan_guard']!r}")

    def _mirror(self, group: dict[str, Any], lr: float | Tensor) -> tuple[float | Tensor, ...]:
        return (0.0, lr * group["alpha"], lr * group["beta"], HAM_EXPONENT_CLIP)

    def _guard(self, group: dict[str, Any]) -> bool:
        return group["nan_guard"]

    def _norm_cap(self, group: dict[str, Any]) -> float | None:
        return group["max_norm"]

    def _after_step(self, group: dict[str, Any], params: list[Tensor]) -> None:
        """The reference wrapper's norm cap, on every parameter with a gradient (biases and norms
        too): a tensor whose L2 norm exceeds ``max_norm`` is rescaled to it. The step capped
        those it could in its own pass (``_norm_cap``); the others' norms are computed here (a
        DTensor's is its whole tensor's)."""
        max_norm = group["max_norm"]
        if max_norm is None or not params:
            return
        # complex tensors as their real views, as in the step
        rest = [torch.view_as_real(p) if p.is_complex() else p for p in params]
        for (_, dtype), ((tensors,), _) in _group_tensors_by_device_and_dtype([rest]).items():
            # min(1, max_norm / norm) without a host sync, for all norms of a device and dtype at
            # once (each computed as it would be alone); a zero tensor keeps its factor 1
            norms = torch.stack(torch._foreach_norm(tensors))
            factors = torch.clamp(max_norm / norms.clamp(min=torch.finfo(dtype).tiny), max=1.0)
            torch._foreach_mul_(tensors, factors.unbind())
