"""A sparsity sweep's runs stay apart in the tables: real runs of `train_vit.py -m acdc.sparsity=0.8,0.9`
(smoke size) give both columns in horst-sparse tables and horst-sparse sweep-table, each its own run's number."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from conftest import HORST_SPARSE, QUIET_ENV, ROOT

TINY = ["experiment=smoke_vit", "train.batch_size=256", "train.base_batch_size=256", "train.checkpoint_interval=0"]


@pytest.fixture(scope="module")
def sparsity_sweep(tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("sparsity") / "sweep"
    env = {**os.environ, **QUIET_ENV, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "train_vit.py", "-m", *TINY, "acdc.sparsity=0.8,0.9", f"hydra.sweep.dir={sweep_dir}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return sweep_dir


def top1_of_each_run(sweep_dir) -> dict[float, float]:
    summaries = [json.loads(p.read_text()) for p in sweep_dir.glob("*/summary.json")]
    return {s["target_sparsity"]: round(100 * s["top1"], 2) for s in summaries}


def test_every_sparsity_of_the_sweep_is_a_column_of_its_own(sparsity_sweep, tmp_path):
    out = tmp_path / "tables"
    done = subprocess.run(
        [HORST_SPARSE, "tables", str(sparsity_sweep), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "one replicate" not in done.stdout + done.stderr + (out / "tables.md").read_text()
    cells = pd.read_csv(out / "vit_top1.csv")
    measured = top1_of_each_run(sparsity_sweep)
    assert sorted(measured) == [0.8, 0.9]
    assert dict(zip(cells.sparsity, cells["mean"].round(2))) == measured and list(cells.n) == [1, 1]
    assert "| arm | 80 % | 90 % | n |" in (out / "tables.md").read_text()


def test_the_sweep_table_keeps_both_sparsities(sparsity_sweep, tmp_path):
    done = subprocess.run(
        [HORST_SPARSE, "sweep-table", str(sparsity_sweep), "--out", str(tmp_path / "sweep")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    written = "".join(p.read_text() for p in sorted((tmp_path / "sweep").rglob("*.md")))
    assert "one replicate" not in done.stdout + done.stderr + written
    grid = pd.read_csv(tmp_path / "sweep" / "sweep.csv")
    measured = top1_of_each_run(sparsity_sweep)
    assert dict(zip(grid.setting, grid["mean"].round(2))) == {
        "sparsity=0.8": measured[0.8],
        "sparsity=0.9": measured[0.9],
    }
    assert list(grid.n) == [1, 1]
