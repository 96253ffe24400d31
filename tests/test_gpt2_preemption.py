"""SLURM's pre-timeout signal: the run checkpoints, exits for requeue, and resumes with no
lost or repeated step (horst_sparse/training/preemption.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, _subprocess_env, compose_cfg, final_params, logged_steps, read_records, tiny_overrides

from horst_sparse.gpt2.run import run
from horst_sparse.training.preemption import PREEMPTED_EXIT_CODE

pytestmark = pytest.mark.usefixtures("quiet_single_threaded")


def test_sigusr2_checkpoints_exits_and_resumes_without_lost_or_repeated_steps(pydoc_dir, tmp_path, capsys):
    # No periodic checkpoint before the end: the one the signal writes is the only one.
    overrides = tiny_overrides(
        pydoc_dir, "train.max_steps=16", "train.eval_interval=8", "train.checkpoint_interval=0", "train.log_interval=1"
    )
    reference = tmp_path / "reference"
    run(compose_cfg(overrides), run_dir=reference)

    run_dir = tmp_path / "preempted"
    command = [sys.executable, str(ROOT / "train_gpt2.py"), *overrides, f"hydra.run.dir={run_dir}"]
    child = subprocess.Popen(command, env=_subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while len(logged_steps(run_dir)) < 3 and child.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    child.send_signal(signal.SIGUSR2)
    child.wait(timeout=120)
    assert child.returncode == PREEMPTED_EXIT_CODE, child.stderr.read().decode()[-2000:]
    (checkpoint,) = run_dir.glob("ckpt_*.pt")
    stopped_at = int(checkpoint.stem.split("_")[1])
    assert 3 <= stopped_at < 16 and not (run_dir / "summary.json").exists()
    assert logged_steps(run_dir) == list(range(1, stopped_at + 1))

    run(compose_cfg(overrides), run_dir=run_dir)  # the requeued job
    assert f"resumed from {checkpoint}" in capsys.readouterr().out
    assert logged_steps(run_dir) == list(range(1, 17))  # each step once
    without_markers = lambda d: [r for r in read_records(d) if r.get("event") != "checkpoint"]  # noqa: E731
    assert without_markers(run_dir) == without_markers(reference)
    expected, actual = final_params(reference), final_params(run_dir)
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name


@pytest.mark.slow  # ~40 s: a second full run; the training-phase USR2 test above stays in the default suite
def test_sigusr2_during_the_pruning_evaluation_exits_for_requeue_and_the_rerun_finishes_it(pydoc_dir, tmp_path):
    """Training is done and checkpointed; the signal lands while copies are pruned and
    evaluated: exit 3 at the next sparsity, and the requeued run redoes only the evaluation."""
    overrides = tiny_overrides(
        pydoc_dir,
        "train.max_steps=4",
        "eval.max_windows=150",
        "eval.batch_size=2",
        "prune.sparsities=[0.0,0.3,0.5,0.6,0.7,0.8,0.9]",
    )
    reference = tmp_path / "reference"
    run(compose_cfg(overrides), run_dir=reference)

    run_dir = tmp_path / "preempted"
    command = [sys.executable, str(ROOT / "train_gpt2.py"), *overrides, f"hydra.run.dir={run_dir}"]
    child = subprocess.Popen(
        command, env=_subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 120
    while not (run_dir / "weight_histogram.json").exists() and child.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    child.send_signal(signal.SIGUSR2)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == PREEMPTED_EXIT_CODE, stderr[-2000:]
    assert "continue with: python train_gpt2.py " in stderr and f"hydra.run.dir={run_dir}" in stderr
    assert not (run_dir / "summary.json").exists()

    summary = run(compose_cfg(overrides), run_dir=run_dir)  # the requeued job
    assert summary["ppl"] == json.loads((reference / "summary.json").read_text())["ppl"]
    records = read_records(run_dir)
    assert sum("prune/ppl@0.9" in r for r in records) == 1  # each result logged once
