"""The test suite's pacing knob (horst_sparse/training/test_pacing.py): refused in one line outside
the test suite, and inside it every optimizer step of a run takes at least the time it says."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, _subprocess_env, compose_cfg, tiny_overrides

from horst_sparse.gpt2.run import run
from horst_sparse.training.config import RunError
from horst_sparse.training.test_pacing import SECONDS_PER_STEP, seconds_per_step


def test_the_knob_outside_the_test_suite_stops_the_run_at_start_up_in_one_line(tmp_path):
    env = {k: v for k, v in _subprocess_env().items() if k != "PYTEST_CURRENT_TEST"} | {SECONDS_PER_STEP: "1"}
    run_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "train_gpt2.py"), "experiment=smoke_gpt2", f"hydra.run.dir={run_dir}"]
    refused = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines() == [
        f"error: {SECONDS_PER_STEP}=1 is for the test suite only (it slows every training step, and no test is "
        f"running); unset {SECONDS_PER_STEP}"
    ]
    assert not run_dir.exists()  # refused before the run wrote anything


@pytest.mark.parametrize("value", ["x", "-1", "nan"])
def test_a_value_that_is_no_time_is_one_line(value, monkeypatch):
    monkeypatch.setenv(SECONDS_PER_STEP, value)
    with pytest.raises(RunError, match=f"^{SECONDS_PER_STEP}={value}: give a number of seconds >= 0$"):
        seconds_per_step()


def test_each_step_takes_at_least_the_knobs_time(pydoc_dir, tmp_path, quiet_single_threaded, monkeypatch):
    seconds, steps = 0.5, 5
    overrides = tiny_overrides(
        pydoc_dir,
        f"train.max_steps={steps}",
        "train.log_interval=1",
        "train.eval_interval=0",
        "train.checkpoint_interval=0",
        "prune.sparsities=[0.0]",
    )
    monkeypatch.setenv(SECONDS_PER_STEP, str(seconds))
    summary = run(compose_cfg(overrides), run_dir=tmp_path / "run")
    assert os.environ["PYTEST_CURRENT_TEST"]  # what lets the knob through
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    logged = [json.loads(line)["time"] for line in lines if '"train/loss"' in line]
    assert len(logged) == steps
    # Each step's record is written a few milliseconds after its pacing (the optimizer step between).
    assert all(later - earlier >= seconds - 0.05 for earlier, later in zip(logged, logged[1:])), logged
    assert summary["wall_time_s"] >= steps * seconds  # the first step too, from the run's start
