"""Checkpoint at the next step on the signals that stop a run: SLURM's and the user's.

* SIGUSR2: SLURM sends it some time before a time limit (``#SBATCH --signal=USR2@300``,
  which submitit sets from the launcher's ``signal_delay_s``), and on preemption where the
  cluster opts in (``SlurmctldParameters=preempt_send_user_signal`` in 22.05,
  ``PreemptParameters=send_user_signal`` from 23.02). Under submitit the job already has a
  handler for it that requeues the job (the Hydra submitit launcher makes every job
  checkpointable by resubmitting it with its own arguments).
* SIGTERM: what SLURM sends otherwise on preemption, and on ``scancel`` and
  ``scontrol requeue`` (SIGKILL follows after ``KillWait``, 30 s by default). Submitit
  ignores it. A preempted job (``PreemptMode=REQUEUE``) is requeued by SLURM itself; a
  cancelled one ends. With ``preempt_send_user_signal`` a preempted job gets SIGUSR2 and
  SIGTERM at once: SLURM is already requeuing it, and submitit's ``scontrol requeue`` would
  fail (the cell would end failed), so after SIGTERM the run exits and leaves it to SLURM.
  SLURM's accounting tells the cases apart (`sacct`: CANCELLED by <uid>, PREEMPTED, REQUEUED;
  squeue and scontrol say only COMPLETING): a cancelled job's run says so and exits with
  ``SlurmCancelled``, which `hydra_task` records as a failed cell.
* SIGINT: Ctrl-C. A second Ctrl-C stops at once.

``PreemptionGuard`` takes them over: the handler only records the signal; the training
loop polls ``requested`` once per step, writes a checkpoint, then calls
``requeue_or_exit``: after SIGUSR2 under submitit it hands over to submitit's handler
(requeue); otherwise it prints the command that continues the run and exits with
``PREEMPTED_EXIT_CODE``. The run started again in the same run folder continues from that
checkpoint (``resume=auto``): no step is lost or repeated.

That command is printed to be pasted: ``hydra_override`` and ``command_line`` quote it for
Hydra's grammar and for the shell (a run folder named after its overrides holds ``=`` and ``,``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 3  # not 0: a wrapper script must know the run is unfinished
STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)


def hydra_override(key: str, value: str) -> str:
    """`key=value` as Hydra's override grammar reads it back: a value with anything but
    letters, digits and `_/.+-` (`=`, `,`, spaces, quotes, brackets) goes in Hydra's quotes."""
    from hydra.core.override_parser.types import Quote, QuotedString

    if re.fullmatch(r"[A-Za-z0-9_/.+-]+", value):
        return f"{key}={value}"
    return f"{key}={QuotedString(text=value, quote=Quote.single).with_quotes()}"


def command_line(arguments: Iterable[str]) -> str:
    """`arguments` as one line a POSIX shell runs as these arguments (`shlex.join`), except that
    an argument holding Hydra's single quotes goes in double quotes where the shell leaves it
    as it is there: `"hydra.run.dir='/tmp/a=b'"`, not shlex's `'hydra.run.dir='"'"'/tmp/a=b'"'"''`."""
    return " ".join(f'"{a}"' if "'" in a and not set(a) & set('"$`\\!') else shlex.quote(a) for a in arguments)


def slurm_job_id() -> str | None:
    """This process's SLURM job as submitit, sacct and the launcher's `jobs.json` name it
    (`<array job>_<task>` for a task of a job array), or None outside SLURM."""
    job, array, task = (os.environ.get(k) for k in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"))
    return f"{array}_{task}" if array and task else job


def slurm_job_state(job_id: str) -> str | None:
    """sacct's state of the job (`CANCELLED by 0`, `PREEMPTED`, `REQUEUED`, `RUNNING`, ...), or
    None where sacct cannot say (no accounting, no sacct on the node)."""
    command = ["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.strip().splitlines()[-1] if out.strip() else None


class SlurmCancelled(SystemExit):
    """SLURM cancelled this job (`scancel`): the checkpoint is written and the process exits with
    ``PREEMPTED_EXIT_CODE``; `hydra_task` records the cell as failed, with why and where."""

    def __init__(self, *, job_id: str, state: str, step: int | None) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.job_id, self.state, self.step = job_id, state, step

    @property
    def reason(self) -> str:
        at = f" at step {self.step}" if self.step is not None else ""
        return f"cancelled: SLURM job {self.job_id} {self.state} (scancel){at}, checkpoint written"


class PreemptionGuard:
    """Records the first of `signals` to arrive so the loop can checkpoint before stopping."""

    def __init__(self, signals: Iterable[int] = STOP_SIGNALS) -> None:
        self._arrived: list[int] = []  # every signal that arrived, in order
        self._previous: dict[int, Any] = {s: signal.getsignal(s) for s in signals}
        for signum in self._previous:
            signal.signal(signum, self._record)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if signum not in self._arrived:
            self._arrived.append(signum)
        if signum == signal.SIGINT:  # the second Ctrl-C interrupts whatever is running
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.write(2, b"\ninterrupted: stopping after this step with a checkpoint (Ctrl-C again to stop now)\n")

    @property
    def received(self) -> int | None:
        """The first signal that arrived, or None."""
        return self._arrived[0] if self._arrived else None

    def requested(self) -> bool:
        """Whether any rank received a stop signal (a collective call under DDP: every rank
        must call it at the same step)."""
        flag = self.received is not None
        if dist.is_available() and dist.is_initialized():
            device = "cuda" if dist.get_backend() == "nccl" else "cpu"
            tensor = torch.tensor([float(flag)], device=device)
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
            flag = bool(tensor.item())
        return flag

    def requeue_or_exit(self, continue_command: str = "the same command", *, step: int | None = None) -> None:
        """Call after the checkpoint (of `step`) is written: after SIGUSR2 alone, submitit's
        handler requeues the job; otherwise (no submitit, SIGINT, or SIGTERM: with SIGUSR2 too, a
        preemption SLURM requeues itself) the process exits with ``PREEMPTED_EXIT_CODE``,
        printing the command that continues the run; a SLURM job that SIGTERM came to because it
        was cancelled raises ``SlurmCancelled``, saying so. Does not return."""
        received, arrived, usr2_handler = self.received, self._arrived, self._previous.get(signal.SIGUSR2)
        terminated = signal.SIGTERM in arrived
        self.close()
        if received == signal.SIGUSR2 and callable(usr2_handler) and not terminated:
            log.warning("preempted: checkpoint written, handing over to the requeue handler")
            usr2_handler(signal.SIGUSR2, None)
        # SLURM sends a cancel, a preemption and a requeue the same SIGTERM; only its accounting knows which.
        if (
            terminated
            and (job_id := slurm_job_id())
            and (state := slurm_job_state(job_id) or "").startswith("CANCELLED")
        ):
            cancelled = SlurmCancelled(job_id=job_id, state=state, step=step)
            print(f"{cancelled.reason}; continue with: {continue_command}", file=sys.stderr, flush=True)
            raise cancelled
        name = " and ".join(signal.Signals(s).name for s in arrived) if arrived else "another process's signal"
        print(f"stopped by {name}: checkpoint written; continue with: {continue_command}", file=sys.stderr)
        sys.exit(PREEMPTED_EXIT_CODE)

    def close(self) -> None:
        """Give the signals back to their previous handlers. Idempotent."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}


@contextlib.contextmanager
def signal_blocked(signals: Iterable[int] = STOP_SIGNALS) -> Iterator[None]:
    """Hold `signals` back while child processes start (DataLoader workers, multiprocessing's
    fork server and resource tracker). A blocked signal stays blocked across fork and exec, so
    the children never act on it; one sent to this process meanwhile is delivered when the
    block ends. SLURM signals every process of the job and Ctrl-C the terminal's whole process
    group: a worker would otherwise die of SIGUSR2's or SIGTERM's default action (or raise
    KeyboardInterrupt), failing the epoch before the checkpoint is written. (A worker whose
    parent is gone exits on its own: the DataLoader's watchdog.)"""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, set(signals))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
