"""HORST and HAM: AdamW (or Lion, or SGD) composed with a hyperbolic mirror step.

Drop-in ``torch.optim`` optimizers that bias training towards sparse, prunable weights.
Jacobs, Jain, Burkholz, "HORST: Composing Optimizer Geometries for Sparse Transformer
Training", arXiv 2605.21104; Jacobs et al., "HAM", ICLR 2026, arXiv 2506.02630.
Depends on torch only.
"""

from horst.ham import HAM
from horst.horst import HORST
from horst.lion import HORSTLion
from horst.sgd import HORSTSGD

__all__ = ["HAM", "HORST", "HORSTLion", "HORSTSGD"]
