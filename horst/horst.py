"""HORST: AdamW composed with the hyperbolic mirror step, mirror after steepest descent.

Jacobs, Jain, Burkholz, "HORST: Composing Optimizer Geometries for Sparse Transformer
Training", arXiv 2605.21104 (HiLD @ ICML 2026). With ``u = Adam(g, lr)`` (bias-corrected,
lr included):

    theta_half = theta * (1 - lr * weight_decay) - u
    theta_new  = theta_half * exp(-alpha * sign(theta_half) * u - lr * beta)

``alpha = beta = 0`` is exactly ``torch.optim.AdamW``. ``order="sm"`` applies the mirror step
first, the composition the paper shows cancels the sparsity bias (an ablation).

Keep ``alpha * lr`` well below 1: each step scales a weight by about ``exp(+-alpha * |u|)``
with ``|u|`` up to a few ``lr``. The defaults ``alpha=10, beta=0.1`` are ours (the paper's
values are not public); they held up in small sweeps at lr ~1e-3 (see the README).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from horst.adamw_mirror import AdamWMirror
from horst.functional import MirrorCoefficients
from horst.mirror import NO_CLIP


class HORST(AdamWMirror):
    """Hyperbolic Operator for Robust Sparse Training over AdamW.

    Args:
        params: parameters or param groups. A group may set ``hyperbolic`` (bool) to
            choose whether its tensors take the mirror step; by default tensors with
            ``ndim >= 2`` do and the others get plain AdamW.
        lr, betas, eps, weight_decay: as in ``torch.optim.AdamW`` (decoupled decay).
        alpha: strength of the mirror step (the L1 bias); 0 turns it off.
        beta: extra multiplicative shrinkage, ``exp(-lr * beta)`` per step.
        order: ``"ms"`` (the paper's HORST) or ``"sm"`` (ablation).
        fused: ``None``/``True`` for the fast path (a C kernel for float32 on CPU, a
            ``torch.compile``d kernel otherwise; ``horst._fast_path``), ``False`` for the
            plain path; ``None`` reads ``HORST_FUSED`` (0 switches the fast path off).
    """

    def __init__(
        self,
        params: Iterable[Any],
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        alpha: float = 10.0,
        beta: float = 0.1,
        order: str = "ms",
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
            alpha=alpha, beta=beta, order=order, fused=fused,
        )  # fmt: skip

    def mirror_coefficients(self, group: dict[str, Any]) -> MirrorCoefficients:
        return MirrorCoefficients(
            alpha_u=group["alpha"], alpha_g=0.0, lr_beta=group["lr"] * group["beta"], clip=NO_CLIP
        )
