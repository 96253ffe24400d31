"""HORST and HAM: AdamW (or Lion, or SGD) composed with a hyperbolic mirror step.

Drop-in ``torch.optim`` optimizers that bias training towards sparse, prunable weights.
Jacobs, Jain, Burkholz, "HORST: Composing Optimizer Geometries for Sparse Transformer
Training", arXiv 2605.21104; Jacobs et al., "HAM", ICLR 2026, arXiv 2506.02630.
Depends on torch only. One file per steepest-descent base (``adamw``, ``lion``, ``sgd``) over
the shared base class (``optimizer.MirrorOptimizer``) and functional core (``functional``).
Where timm is used, ``timm.optim.create_optimizer_v2(model, opt="horst")`` (``"ham"``,
``"horstlion"``, ``"horstsgd"``) builds them once ``horst`` is imported (``horst.timm``).
"""

from horst._after_import import call_after_import
from horst.adamw import HAM, HORST
from horst.lion import HORSTLion
from horst.optimizer import MirrorOptimizer
from horst.sgd import HORSTSGD

__all__ = ["HAM", "HORST", "HORSTLion", "HORSTSGD", "MirrorOptimizer"]


def _register_with_timm() -> None:
    """Registers the optimizers in timm's registry (``horst.timm``)."""
    from horst.timm import register

    register()


call_after_import("timm.optim", _register_with_timm)
