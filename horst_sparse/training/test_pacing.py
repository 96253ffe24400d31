"""A knob for the test suite only: every optimizer step takes at least a given time.

``HORST_TEST_SECONDS_PER_STEP=S`` (seconds, a number >= 0) makes each optimizer step of either
pipeline take at least ``S`` seconds: the run sleeps what is left of ``S`` since its previous
step (`Run.watch_loss`, once per step in both pipelines, calls `pace_step`). The tests whose
verdict needs a run still training when something reaches it (a signal, a preemption, a SLURM
time limit, a cancel) set it, so that verdict does not depend on how fast the machine trains.
A sleep changes no number the run computes; only its throughput (``perf/*``) and wall time.

It is refused outside the test suite: a run with it set and no ``PYTEST_CURRENT_TEST`` in its
environment (pytest sets that while a test runs; the test's subprocesses, torchrun's workers and
the SLURM jobs it submits inherit it: sbatch exports the submitting environment) stops at start-up
with one line, so a variable left in a shell never slows a real run.
"""

from __future__ import annotations

import math
import os
import time

from horst_sparse.training.config import RunError

SECONDS_PER_STEP = "HORST_TEST_SECONDS_PER_STEP"


def seconds_per_step() -> float:
    """The knob's value: 0.0 where it is unset or empty. `RunError` (one line) where it is set
    outside the test suite, or is not a number of seconds >= 0."""
    value = os.environ.get(SECONDS_PER_STEP, "")
    if not value:
        return 0.0
    if "PYTEST_CURRENT_TEST" not in os.environ:
        raise RunError(
            f"{SECONDS_PER_STEP}={value} is for the test suite only (it slows every training step, and no "
            f"test is running); unset {SECONDS_PER_STEP}"
        )
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise RunError(f"{SECONDS_PER_STEP}={value}: give a number of seconds >= 0")
    return seconds


def pace_step(previous: float) -> float:
    """Sleep until `previous` (the `time.time()` this returned at the previous step, or the
    run's start before its first step) plus `seconds_per_step()`; returns the time now, the
    next step's `previous`. Without the knob it returns at once."""
    seconds = seconds_per_step()
    now = time.time()
    if seconds and now < previous + seconds:
        # A signal's handler does not cut it short (PEP 475): the loop sees the signal after this step.
        time.sleep(previous + seconds - now)
        now = time.time()
    return now
