"""SLURM's pre-timeout signal in the ViT pipeline: the run checkpoints mid-epoch, exits for
requeue, and the requeued run continues that epoch from the next batch with no lost or
repeated step (horst_sparse/training/preemption.py; the skipping itself: tests/test_vit_data.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import QUIET_ENV, ROOT, _compose, deit_overrides, logged_steps, read_records

import pruning
from horst_sparse.training.checkpoint import CheckpointError, load_checkpoint
from horst_sparse.training.preemption import PREEMPTED_EXIT_CODE
from horst_sparse.vit.run import run

pytestmark = pytest.mark.usefixtures("quiet_env")

STEPS_PER_EPOCH, EPOCHS = 3, 6  # deit_overrides: 24 images, 8 per update, 6 epochs
ACDC_ACTIONS = [("prune", 1), ("restore", 3), ("prune", 4)]  # (action, epoch) of deit_overrides' schedule


def signal_mid_epoch(child: subprocess.Popen, run_dir, *, timeout: float) -> None:
    """SIGUSR2 to `child` inside an epoch after the first, however fast or slow it runs.

    The run polls for the signal after every update, so it stops one or two updates after the
    last one it logged. Frozen (SIGSTOP), it can be read without a race: it is signalled where
    both are mid-epoch (its epoch's first update logged), else let go on to the next chance."""
    deadline = time.time() + timeout
    while time.time() < deadline and child.poll() is None:
        steps = logged_steps(run_dir)
        if steps and steps[-1] > STEPS_PER_EPOCH and steps[-1] % STEPS_PER_EPOCH == 1:
            child.send_signal(signal.SIGSTOP)
            _, status = os.waitpid(child.pid, os.WUNTRACED)  # returns once it is stopped
            assert os.WIFSTOPPED(status), f"the run ended with status {status} before it was signalled"
            if logged_steps(run_dir)[-1] % STEPS_PER_EPOCH == 1:
                child.send_signal(signal.SIGUSR2)  # pending until it runs again
                child.send_signal(signal.SIGCONT)
                return
            child.send_signal(signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"no chance to signal the run mid-epoch (logged steps: {logged_steps(run_dir)})")


def test_sigusr2_mid_epoch_checkpoints_exits_and_resumes_at_the_next_batch(
    imagenet_root, tmp_path, capsys, monkeypatch
):
    # Every update logged; no periodic checkpoint before the end: the signal's is the only one.
    overrides = deit_overrides(imagenet_root, "train.log_interval=1", "train.checkpoint_interval=0")
    reference = tmp_path / "reference"
    run(_compose(overrides), run_dir=reference)

    run_dir = tmp_path / "preempted"
    command = [sys.executable, str(ROOT / "train_vit.py"), *overrides, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, **QUIET_ENV, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    stderr = tmp_path / "stderr.txt"
    with open(stderr, "w") as err:
        child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        signal_mid_epoch(child, run_dir, timeout=300)
        child.wait(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == PREEMPTED_EXIT_CODE, stderr.read_text()[-2000:]
    (checkpoint,) = run_dir.glob("ckpt_*.pt")
    state = load_checkpoint(checkpoint)
    epoch, batch, step = state["epoch"], state["batch"], state["step"]
    assert 1 <= epoch < EPOCHS and 1 <= batch < STEPS_PER_EPOCH and step == epoch * STEPS_PER_EPOCH + batch
    assert not (run_dir / "summary.json").exists()
    assert logged_steps(run_dir) == list(range(1, step + 1))

    # The rest of the epoch would be other images: refused, before anything is written.
    with pytest.raises(CheckpointError, match=r"other settings \(seed: 0 -> 1\)"):
        run(_compose([*overrides, "seed=1"]), run_dir=run_dir)

    # The requeued job, watched: AC/DC acts at the start of later epochs only (the checkpoint
    # holds the interrupted epoch's masks and moments).
    actions = []
    prune, reset = pruning.Sparsifier.prune, pruning.reset_optimizer_moments
    monkeypatch.setattr(pruning.Sparsifier, "prune", lambda *a, **k: actions.append("prune") or prune(*a, **k))
    monkeypatch.setattr(pruning, "reset_optimizer_moments", lambda *a, **k: actions.append("restore") or reset(*a, **k))
    summary = run(_compose(overrides), run_dir=run_dir)
    assert f"resumed from {checkpoint} at epoch {epoch}, batch {batch}" in capsys.readouterr().out
    assert actions == [action for action, at in ACDC_ACTIONS if at > epoch]

    assert logged_steps(run_dir) == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))  # each step once
    without_markers = lambda d: [r for r in read_records(d) if r.get("event") != "checkpoint"]  # noqa: E731
    assert without_markers(run_dir) == without_markers(reference)
    assert summary["epochs"] == json.loads((reference / "summary.json").read_text())["epochs"]
    expected = load_checkpoint(reference / f"ckpt_{EPOCHS * STEPS_PER_EPOCH:08d}.pt")["model"]
    actual = load_checkpoint(run_dir / f"ckpt_{EPOCHS * STEPS_PER_EPOCH:08d}.pt")["model"]
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
