"""prune.at_steps: the dense and pruned perplexities measured during training (the curve), on copies
of the weights: the run's final numbers and weights are those of the same run without it; a resumed
run keeps the points its checkpoint holds and measures the others once; the results layer reads them
as curve points, apart from the final numbers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, _subprocess_env, compose_cfg, final_params, tiny_overrides

from horst_sparse.analysis.matched import curve_points, final_numbers
from horst_sparse.analysis.runs import scan
from horst_sparse.gpt2.config import validate
from horst_sparse.gpt2.pipeline import numbers
from horst_sparse.gpt2.run import run
from horst_sparse.training.checkpoint import CheckpointError
from horst_sparse.training.config import ConfigError

pytestmark = pytest.mark.usefixtures("quiet_single_threaded")

SHORT = ("train.max_steps=6", "train.checkpoint_interval=3", "train.eval_interval=0", "eval.max_windows=16")
CURVE = "prune.at_steps=[2,4]"


def test_the_curve_leaves_the_final_numbers_and_weights_as_they_are(pydoc_dir, tmp_path):
    plain = run(compose_cfg(tiny_overrides(pydoc_dir, *SHORT)), run_dir=tmp_path / "plain")
    measured = run(compose_cfg(tiny_overrides(pydoc_dir, *SHORT, CURVE)), run_dir=tmp_path / "curve")

    assert measured["pruning"]["results"] == plain["pruning"]["results"] and measured["ppl"] == plain["ppl"]
    assert "curve" not in plain["pruning"]  # without at_steps the summary is as it was
    before, after = final_params(tmp_path / "plain"), final_params(tmp_path / "curve")
    assert all(torch.equal(before[name], after[name]) for name in before)

    curve = measured["pruning"]["curve"]
    assert [(p["step"], p["sparsity"]) for p in curve] == [(s, x) for s in (2, 4) for x in (0.0, 0.5, 0.9)]
    assert curve[0]["pattern"] == "dense" and curve[0]["ppl"] > measured["ppl"]["0"]  # 2 updates: worse than 6
    rows = numbers({}, measured)
    assert [r["metric"] for r in rows] == ["ppl"] * 3 + ["ppl_curve"] * 6
    assert [r.get("step") for r in rows] == [None] * 3 + [2, 2, 2, 4, 4, 4]

    found = scan([tmp_path]).frame
    assert len(curve_points(found)) == 6 and set(curve_points(found).step) == {2, 4}
    assert len(final_numbers(found)) == 2 * (3 + 2)  # each run's 3 perplexities and 2 weight statistics


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("prune.at_steps=[6]", r"increasing updates in \[1, train.max_steps=6\)"),
        ("prune.at_steps=[4,2]", "increasing"),
        ("prune.sparsities=[0.5]", "list 0.0 in prune.sparsities"),
    ],
)
def test_at_steps_that_cannot_work_are_refused(pydoc_dir, extra, words):
    cfg = compose_cfg(tiny_overrides(pydoc_dir, *SHORT, CURVE, extra))
    with pytest.raises(ConfigError, match=words):
        validate(cfg, world_size=1)


def test_a_run_resumed_through_the_entry_point_keeps_its_curve(pydoc_dir, tmp_path):
    """The smoke preset with a curve, its last checkpoint and summary removed (a run killed after
    the checkpoint at 3): continued by `python train_gpt2.py`, it keeps the point at 2 from the
    checkpoint and measures the one at 4 once; its curve and numbers are the uninterrupted run's."""
    overrides = ["experiment=smoke_gpt2", *tiny_overrides(pydoc_dir, *SHORT, CURVE)]
    run_dir = tmp_path / "run"
    whole = run(compose_cfg(overrides), run_dir=run_dir)
    (run_dir / "ckpt_00000006.pt").unlink()
    (run_dir / "summary.json").unlink()

    command = [sys.executable, str(ROOT / "train_gpt2.py"), *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, env=_subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout + done.stderr and "step 3" in done.stdout + done.stderr
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["pruning"]["curve"] == whole["pruning"]["curve"]
    assert resumed["pruning"]["results"] == whole["pruning"]["results"]

    # The curve's settings stay as they were when the run continues
    (run_dir / "summary.json").unlink()
    other = compose_cfg([*overrides, "prune.at_steps=[2]"])
    with pytest.raises(CheckpointError, match=r"during training \(prune.at_steps\) with other settings"):
        run(other, run_dir=run_dir)
