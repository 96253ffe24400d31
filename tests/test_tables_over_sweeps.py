"""horst-sparse tables (horst-sparse tables) and horst-sparse status --tables over an ordinary sweep, on
real run folders: the digits ViT through `train_vit.py -m` over two train.epochs values and two
seeds, a cell that diverged in its own multirun, a cell SLURM cancelled (its failed.json as
horst-sparse status writes it), and the same cell run twice. Cells are keyed by settings and named
by the keys that differ, a repeat of a seed is one replicate, the runs that ended early are told
apart, and the claims are judged only where the runs are one study."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import HORST_SPARSE, QUIET_ENV, ROOT

from horst_sparse.analysis import runs
from horst_sparse.training.runner import NON_FINITE_EXIT_CODE, record_failed_cell

# real multiruns of five runs (~1.5 min on 2 cores): make test-all; test_make_tables.py covers the rules on written runs
pytestmark = pytest.mark.slow

# The smoke ViT on the digits, 4 updates an epoch: AC/DC's phases fit 4 and 6 epochs.
TINY = [
    "experiment=smoke_vit",
    "train.batch_size=256",
    "train.base_batch_size=256",
    "train.checkpoint_interval=0",
]


def _multirun(sweep_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **QUIET_ENV, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / "train_vit.py"), "-m", *TINY, *overrides, f"hydra.sweep.dir={sweep_dir}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory) -> Path:
    """`sweep/`: train.epochs=4,6 x seed=0,1 (4 finished runs); `diverged/`: one cell whose loss
    became NaN (failed.json, exit code 4)."""
    root = tmp_path_factory.mktemp("real_runs")
    done = _multirun(root / "sweep", "train.epochs=4,6", "seed=0,1")
    assert done.returncode == 0, done.stderr[-3000:]
    diverged = _multirun(root / "diverged", "train.epochs=4", "train.base_lr=1e30", "seed=0")
    assert diverged.returncode == 1 and "training loss is nan" in diverged.stderr, diverged.stderr[-3000:]
    return root


@pytest.fixture
def sweep(real_runs, tmp_path) -> Path:
    """A copy of the real runs this test may add to."""
    shutil.copytree(real_runs, tmp_path / "runs")
    return tmp_path / "runs"


def _folder(sweep_dir: Path, epochs: int, seed: int) -> Path:
    (folder,) = [
        p.parent
        for p in sweep_dir.glob("*/config.yaml")
        if (c := yaml.safe_load(p.read_text()))["train"]["epochs"] == epochs and c["seed"] == seed
    ]
    return folder


def _cancel(sweep_dir: Path, num: int, epochs: int, seed: int) -> Path:
    """A cell SLURM cancelled before it ran, recorded as horst-sparse status records it."""
    config = yaml.safe_load((_folder(sweep_dir, epochs, 0) / "config.yaml").read_text()) | {"seed": seed}
    folder = sweep_dir / f"{num}_vit_digits_horst_s0.9_seed{seed}_cancelled"
    state = "CANCELLED by 0"
    record_failed_cell(
        folder,
        pipeline="vit",
        reason=f"SLURM job 4242_{num} ended {state} without a summary",
        exit_code=None,
        step=None,
        config=config,
        slurm_job_id=f"4242_{num}",
        slurm_state=state,
    )
    return folder


def _tables(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([HORST_SPARSE, "tables", *arguments], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _rows(tables_md: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in tables_md.splitlines()
        if line.startswith("| digits |")
    ]


def test_a_sweep_of_two_epochs_and_two_seeds_is_one_cell_per_setting_named_by_its_key(real_runs, tmp_path):
    """The issue's done-when: one cell per setting, n=2 each, labelled `train.epochs=...`, exit 0;
    the claims are not judged (one line says why), the tables and the record are written."""
    out = tmp_path / "out"
    done = _tables(str(real_runs / "sweep"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "error:" not in done.stderr
    rows = _rows((out / "tables.md").read_text())
    assert [(r[3], r[-1]) for r in rows] == [("train.epochs=4", "2"), ("train.epochs=6", "2")]
    cells = pd.read_csv(out / "vit_top1.csv")
    assert list(cells.setting) == ["train.epochs=4", "train.epochs=6"] and list(cells.n) == [2, 2]
    assert list(cells.seeds) == ["0;1", "0;1"]
    claims_lines = [line for line in done.stdout.splitlines() if line.startswith("claims not judged")]
    assert len(claims_lines) == 1 and "vit horst ran 2 settings" in claims_lines[0], done.stdout
    assert "train.epochs=4; train.epochs=6" in claims_lines[0]
    assert not (out / "claims.md").exists() and not (out / "headline.md").exists()
    assert claims_lines[0] in (out / "README.md").read_text()
    assert len(pd.read_csv(out / "runs.csv").run.unique()) == 4


def test_the_same_seed_run_twice_is_one_replicate_and_said(sweep, tmp_path):
    """A cell run again into another sweep folder: n stays 2 (seeds 0;1, not 0;0;1), and the
    tables say which folder counted."""
    first = _folder(sweep / "sweep", 4, 0)
    shutil.copytree(first, sweep / "again" / first.name)
    out = tmp_path / "out"
    done = _tables(str(sweep / "sweep"), str(sweep / "again"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    cells = pd.read_csv(out / "vit_top1.csv").set_index("setting")
    assert cells.loc["train.epochs=4", "n"] == 2 and cells.loc["train.epochs=4", "seeds"] == "0;1"
    said = [line for line in (out / "tables.md").read_text().splitlines() if "one replicate, counted once" in line]
    assert len(said) == 1 and "the settings and seed (0)" in said[0]


def test_cancelled_diverged_and_unfinished_runs_are_told_apart(sweep, tmp_path):
    """A cell SLURM cancelled counts in no cell (not `[diverged 1]`); the cell whose loss became
    NaN counts as `[diverged 1]` in its own setting's row; an unfinished folder is listed as such."""
    cancelled = _cancel(sweep / "sweep", 4, epochs=6, seed=2)
    unfinished = _folder(sweep / "sweep", 6, 1).with_name("5_unfinished")
    unfinished.mkdir()
    shutil.copy(_folder(sweep / "sweep", 6, 1) / "config.yaml", unfinished / "config.yaml")
    # a single run (no multirun: no failed.json) whose loss became NaN after a checkpoint, which
    # the runner set aside as *.diverged: its folder as the runner leaves it
    alone = sweep / "alone"
    shutil.copytree(_folder(sweep / "sweep", 4, 1), alone)
    (alone / "summary.json").unlink()
    (checkpoint,) = alone.glob("ckpt_*.pt")
    checkpoint.rename(checkpoint.with_name(checkpoint.name + ".diverged"))
    out = tmp_path / "out"
    done = _tables(str(sweep), "--out", str(out))
    assert done.returncode == 0, done.stderr
    text = (out / "tables.md").read_text()
    assert "alone: diverged (a checkpoint set aside as *.diverged; no failed.json" in text
    cells = pd.read_csv(out / "vit_top1.csv")
    six = cells[cells.setting.str.contains("train.epochs=6")].iloc[0]
    assert (six.n, six.diverged) == (2, 0)
    (diverged,) = [r for r in _rows(text) if "train.base_lr=1e+30" in r[3]]
    assert diverged[4] == "– [diverged 1]"
    assert f"{cancelled.name}: cancelled (CANCELLED by 0, before it trained); no number" in text
    assert "diverged (non-finite loss, exit code 4: training loss is nan at step" in text
    assert "counted in its cell as diverged" in text
    assert f"{unfinished.name}: unfinished (config.yaml but no summary.json or failed.json" in text
    assert runs.DIVERGED_EXIT_CODE == NON_FINITE_EXIT_CODE


def test_sweep_status_tables_over_a_sweep_ends_without_an_error(sweep, tmp_path):
    """horst-sparse status --tables over the SLURM sweep (jobs.json as the launcher writes it;
    every cell has ended, so SLURM is not asked): the cells' states, then the tables, the claims
    line, and its own exit status (1: a cell was cancelled), no traceback and no `error:`."""
    sweep_dir = sweep / "sweep"
    cancelled = _cancel(sweep_dir, 4, epochs=6, seed=2)
    folders = sorted(p.parent for p in sweep_dir.glob("*/config.yaml")) + [cancelled]
    cells = [
        {
            "num": i,
            "slurm_job_id": f"4242_{i}",
            "run_dir": str(folder),
            "config": yaml.safe_load((folder / "config.yaml").read_text())
            if (folder / "config.yaml").is_file()
            else json.loads((folder / "failed.json").read_text())["config"],
        }
        for i, folder in enumerate(folders)
    ]
    jobs = {"pipeline": "vit", "submitit_folder": str(sweep_dir / ".submitit" / "%j"), "cells": cells}
    (sweep_dir / "jobs.json").write_text(json.dumps(jobs))
    out = tmp_path / "tables"
    done = subprocess.run(
        [HORST_SPARSE, "status", str(sweep_dir), "--tables", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr  # horst-sparse status's own: a failed cell
    assert "Traceback" not in done.stderr and "error:" not in done.stderr, done.stderr
    assert "4 done, 1 failed, 0 running, 0 pending of 5 cells" in done.stdout
    assert "claims not judged" in done.stdout and (out / "runs.csv").is_file()
    assert [r[3] for r in _rows((out / "tables.md").read_text())] == ["train.epochs=4", "train.epochs=6"]
