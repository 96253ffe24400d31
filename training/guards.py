"""Stop a run whose loss is no longer finite, pointing at the last good checkpoint."""

from __future__ import annotations

import math
import os

from training.checkpoint import latest_checkpoint

# Exit status of a run stopped by a non-finite loss (distinct from preemption's).
NON_FINITE_EXIT_CODE = 4


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the weights were not updated with it."""


def check_finite_loss(loss: float, *, step: int, run_dir: str | os.PathLike, hint: str = "train.lr") -> None:
    """Raise `NonFiniteLossError` before the optimizer step if `loss` is NaN or infinite.

    Call it on the loss all processes agree on (after the all-reduce), so every process stops."""
    if math.isfinite(loss):
        return
    last = latest_checkpoint(run_dir)
    raise NonFiniteLossError(
        f"training loss is {loss} at step {step}; stopped before updating the weights. "
        f"Last good checkpoint: {last or 'none yet'}. Lower {hint} and rerun"
        + (" (resume=auto continues from that checkpoint)" if last else "")
    )
