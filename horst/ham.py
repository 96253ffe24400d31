"""HAM: Hyperbolic Aware Minimization over AdamW (the paper's baseline).

Jacobs et al., "Hyperbolic Aware Minimization", ICLR 2026, arXiv 2506.02630. After the
AdamW step, hyperbolic tensors take a mirror step driven by the *raw* gradient ``g``:

    theta_new = theta_half * exp(clamp(lr * (-alpha * sign(theta_half) * g - beta), -5, 5))

Defaults are the authors' ImageNet values, ``alpha=200, beta=1e-3``. Zeros stay zero.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from horst.adamw_mirror import AdamWMirror
from horst.functional import MirrorCoefficients
from horst.mirror import HAM_EXPONENT_CLIP


class HAM(AdamWMirror):
    """AdamW, then HAM's gradient-driven hyperbolic step on hyperbolic tensors.

    Args are those of ``horst.HORST`` without ``order`` (HAM always mirrors after AdamW).
    """

    def __init__(
        self,
        params: Iterable[Any],
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        alpha: float = 200.0,
        beta: float = 1e-3,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
            alpha=alpha, beta=beta, order="ms", fused=fused,
        )  # fmt: skip

    def mirror_coefficients(self, group: dict[str, Any]) -> MirrorCoefficients:
        lr = group["lr"]
        return MirrorCoefficients(
            alpha_u=0.0, alpha_g=lr * group["alpha"], lr_beta=lr * group["beta"], clip=HAM_EXPONENT_CLIP
        )
