"""Checkpoint-and-requeue on the signal SLURM sends before a time limit or a preemption.

SLURM (``#SBATCH --signal=USR2@120``, which submitit sets from the launcher's
``signal_delay_s``) sends SIGUSR2 to every task some time before it kills a job. Under
submitit, the job process already has a handler for it that requeues the job (the Hydra
submitit launcher makes every job checkpointable by resubmitting it with its own
arguments). That handler exits at once, so by itself a run would lose everything since its
last periodic checkpoint.

``PreemptionGuard`` takes the signal over: the handler only records it; the training loop
polls ``requested`` once per step, writes a checkpoint, then calls ``requeue_or_exit``,
which hands over to submitit's handler (requeue) or, outside submitit, exits with
``PREEMPTED_EXIT_CODE``. The requeued job starts in the same run folder and continues from
that checkpoint (``resume=auto``): no step is lost or repeated.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from types import FrameType
from typing import Any, Iterator

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 3  # not 0: a wrapper script must know the run is unfinished


class PreemptionGuard:
    """Records SIGUSR2 (or ``signum``) so the loop can checkpoint before handing over."""

    def __init__(self, signum: int = signal.SIGUSR2) -> None:
        self.signum = signum
        self._requested = False
        self._previous: Any = signal.getsignal(signum)
        signal.signal(signum, self._record)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self._requested = True

    def requested(self) -> bool:
        """Whether any rank received the signal (a collective call under DDP: every rank
        must call it at the same step)."""
        flag = self._requested
        if dist.is_available() and dist.is_initialized():
            device = "cuda" if dist.get_backend() == "nccl" else "cpu"
            tensor = torch.tensor([float(flag)], device=device)
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
            flag = bool(tensor.item())
        return flag

    def requeue_or_exit(self, continue_command: str = "the same command") -> None:
        """Call after the checkpoint is written: submitit's handler requeues the job; without
        submitit the process exits with ``PREEMPTED_EXIT_CODE``, printing the command that
        continues the run. Does not return."""
        signal.signal(self.signum, self._previous)
        if callable(self._previous):
            log.warning("preempted: checkpoint written, handing over to the requeue handler")
            self._previous(self.signum, None)
        print(f"preempted: checkpoint written; continue with: {continue_command}", file=sys.stderr)
        sys.exit(PREEMPTED_EXIT_CODE)

    def close(self) -> None:
        signal.signal(self.signum, self._previous)


@contextlib.contextmanager
def signal_blocked(signum: int = signal.SIGUSR2) -> Iterator[None]:
    """Hold `signum` back while child processes start (DataLoader workers, multiprocessing's
    fork server and resource tracker). A blocked signal stays blocked across fork and exec, so
    the children never act on it; one sent to this process meanwhile is delivered when the
    block ends. SLURM signals every process of the job, and a child started by spawn or
    forkserver (Python 3.14's default on Linux) would otherwise die of SIGUSR2's default
    action, failing the epoch before the checkpoint is written."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
