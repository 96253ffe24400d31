"""Linear warm-up then cosine decay of the learning rate, per optimizer update (timm)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from timm.scheduler import CosineLRScheduler


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    total_steps: int,
    warmup_steps: int,
    min_lr: float,
    warmup_lr: float = 0.0,
) -> CosineLRScheduler:
    """Warm up linearly from `warmup_lr` to the optimizer's lr over `warmup_steps` updates,
    then cosine-decay to `min_lr` at `total_steps`.

    Drive it with `scheduler.step_update(num_updates)` after every optimizer step (epoch
    based pipelines count updates too: steps = epochs * updates per epoch).
    """
    # Imported here: `import timm` loads every timm model (seconds), which an entry point's
    # --help, a bad override or a launcher process does not need.
    from timm.scheduler import CosineLRScheduler

    return CosineLRScheduler(
        optimizer,
        t_initial=max(1, total_steps - warmup_steps),
        lr_min=min_lr,
        warmup_t=warmup_steps,
        warmup_lr_init=warmup_lr,
        warmup_prefix=True,  # the cosine starts after the warm-up, as in nanoGPT
        t_in_epochs=False,
    )
