"""The signals that stop a run besides SLURM's pre-timeout SIGUSR2 (tests/test_gpt2_preemption.py):
SIGTERM (what SLURM sends on preemption, `scancel` and `scontrol requeue`) and SIGINT (Ctrl-C).
Each checkpoints at the next step and exits like SIGUSR2 (exit 3, the line that continues the
run); the same command continues and finishes with the weights of an uninterrupted run; typed
once more, it finds the run finished and changes no file (horst_sparse/training/preemption.py,
horst_sparse/training/runner.py's `finished_summary`)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, _subprocess_env, compose_cfg, final_params, logged_steps, read_records, tiny_overrides

from horst_sparse.gpt2.run import run
from horst_sparse.training.preemption import PREEMPTED_EXIT_CODE
from horst_sparse.training.test_pacing import SECONDS_PER_STEP

pytestmark = pytest.mark.usefixtures("quiet_single_threaded")


@pytest.mark.slow  # a real multi-process run; make test-all (keeps make test under 10 min on 2 cores)
def test_sigint_and_sigterm_checkpoint_and_the_same_command_continues_then_changes_nothing(pydoc_dir, tmp_path):
    overrides = tiny_overrides(
        pydoc_dir, "train.max_steps=30", "train.eval_interval=0", "train.checkpoint_interval=0", "train.log_interval=1"
    )
    reference = tmp_path / "reference"
    run(compose_cfg(overrides), run_dir=reference)

    run_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "train_gpt2.py"), *overrides, f"hydra.run.dir={run_dir}"]
    stopped_at = 0
    # Steps of 0.5 s or more (the test suite's pacing): each signalled run is still training when its
    # signal comes, however fast the machine. The run that finishes is not paced.
    paced = {**_subprocess_env(), SECONDS_PER_STEP: "0.5"}
    for signum in (signal.SIGINT, signal.SIGTERM):
        child = subprocess.Popen(command, env=paced, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300  # start-up alone took over 120 s on 2 shared cores at load 20
        while len(logged_steps(run_dir)) < stopped_at + 3 and child.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        child.send_signal(signum)
        _, stderr = child.communicate(timeout=120)
        assert child.returncode == PREEMPTED_EXIT_CODE, stderr[-2000:]
        name = signal.Signals(signum).name
        assert f"stopped by {name}: checkpoint written; continue with: python train_gpt2.py " in stderr
        assert "Traceback" not in stderr and not (run_dir / "summary.json").exists()
        checkpoints = sorted(int(p.stem.split("_")[1]) for p in run_dir.glob("ckpt_*.pt"))
        assert checkpoints[-1] >= stopped_at + 3  # this stop's, at the step after the signal
        stopped_at = checkpoints[-1]
        assert logged_steps(run_dir) == list(range(1, stopped_at + 1)) and stopped_at < 30

    finished = subprocess.run(command, env=_subprocess_env(), capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert logged_steps(run_dir) == list(range(1, 31))  # each step once
    without_markers = lambda d: [r for r in read_records(d) if r.get("event") != "checkpoint"]  # noqa: E731
    assert without_markers(run_dir) == without_markers(reference)
    expected, actual = final_params(reference), final_params(run_dir)
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name

    files = lambda: {
        p: (hashlib.sha256(p.read_bytes()).digest(), p.stat().st_mtime_ns)  # noqa: E731
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and ".hydra" not in p.parts
    }
    before = files()
    again = subprocess.run(command, env=_subprocess_env(), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"{run_dir} holds this run, finished (summary.json); nothing to do" in again.stdout
    assert files() == before


@pytest.mark.parametrize("signals, hands_over", [([signal.SIGUSR2], True), ([signal.SIGUSR2, signal.SIGTERM], False)])
def test_usr2_hands_over_to_the_requeue_handler_unless_sigterm_came_with_it(signals, hands_over, capsys):
    """SIGUSR2 alone (the pre-timeout signal) goes to the handler that was there before (under
    submitit, its requeue); with SIGTERM too (preempt_send_user_signal: SLURM requeues the job
    itself, and submitit's `scontrol requeue` would fail) the run exits for SLURM's requeue.
    Real signals to this process; the previous handler is a recorder standing in for submitit's
    (which needs a SLURM job: tests/test_slurm_cluster.py preempts one both ways)."""
    from horst_sparse.training.preemption import PreemptionGuard

    calls = []
    previous = {
        s: signal.signal(s, lambda signum, frame: calls.append(signum)) for s in (signal.SIGUSR2, signal.SIGTERM)
    }
    try:
        guard = PreemptionGuard()
        for signum in signals:
            signal.raise_signal(signum)
        assert guard.requested() and guard.received == signal.SIGUSR2
        with pytest.raises(SystemExit) as stopped:
            guard.requeue_or_exit()
        assert stopped.value.code == PREEMPTED_EXIT_CODE
        assert calls == ([signal.SIGUSR2] if hands_over else [])
        stopped_by = " and ".join(signal.Signals(s).name for s in signals)
        assert f"stopped by {stopped_by}: checkpoint written" in capsys.readouterr().err
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def paste(line: str, **kwargs) -> subprocess.CompletedProcess:
    """`line` run by bash as a user pastes it at the repository root (`python`: the venv's)."""
    env = {**_subprocess_env(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, **kwargs)


@pytest.mark.slow  # ~20 s: a GPT-2 run interrupted and resumed by the printed line, in a shell
def test_the_line_printed_at_ctrl_c_runs_when_pasted_into_a_shell(pydoc_dir, tmp_path):
    """A run folder named after overrides holds `=` and `,` (and here a space): the printed line,
    pasted as it is, parses in bash and in Hydra and continues the run from its checkpoint."""
    overrides = tiny_overrides(
        pydoc_dir, "train.max_steps=30", "train.eval_interval=0", "train.checkpoint_interval=0", "train.log_interval=1"
    )
    run_dir = tmp_path / "seed2_experiment=smoke_gpt2,train.max_steps=30 x"
    command = [sys.executable, str(ROOT / "train_gpt2.py"), *overrides, f"hydra.run.dir='{run_dir}'"]
    child = subprocess.Popen(
        command, env=_subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 300
    while len(logged_steps(run_dir)) < 3 and child.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == PREEMPTED_EXIT_CODE, stderr[-2000:]
    line = stderr.split("continue with: ", 1)[1].splitlines()[0]
    (checkpoint,) = run_dir.glob("ckpt_*.pt")

    pasted = paste(line, timeout=300)
    assert pasted.returncode == 0, pasted.stderr[-2000:]
    assert f"resumed from {checkpoint}" in pasted.stdout
    assert logged_steps(run_dir) == list(range(1, 31)) and (run_dir / "summary.json").is_file()
