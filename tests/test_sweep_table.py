"""horst_sparse.analysis.sweep and horst-sparse sweep-table: an alpha x beta grid over seeds, its pick, the GPT-2
score, failed runs ranked worst, other settings in other grids."""

from __future__ import annotations

import copy
import subprocess

import numpy as np
import pandas as pd
import pytest
from conftest import HORST_SPARSE, ROOT

from horst_sparse.analysis import sweep
from horst_sparse.analysis.runs import NoRunsError, read_runs
from horst_sparse.training.runner import record_failed_cell


def _horst(config: dict, alpha: float, beta: float, seed: int, **train) -> dict:
    config = copy.deepcopy(config)
    config["optimizer"] |= {"alpha": alpha, "beta": beta}
    config["seed"] = seed
    config["train"] |= train
    return config


def test_vit_grid_mean_over_seeds_and_pick(tmp_path, job_configs, write_run):
    horst = job_configs[("vit", "horst")]
    top1 = {(1.0, 0.1): (0.90, 0.92), (3.0, 0.1): (0.95, 0.97), (1.0, 0.3): (0.96, 0.96), (3.0, 0.3): (0.80, 0.82)}
    for (alpha, beta), values in top1.items():
        for seed, value in enumerate(values):
            write_run(tmp_path / f"a{alpha}_b{beta}_s{seed}", _horst(horst, alpha, beta, seed), value)
    done = subprocess.run(
        [HORST_SPARSE, "sweep-table", str(tmp_path), "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "out" / "sweep.md").read_text()
    assert "| 1 | 91.00 ± 1.41 [2] | **96.00 ± 0.00 [2]** |" in text  # a tie at 96 goes to the smaller alpha
    assert "| 3 | 96.00 ± 1.41 [2] | 81.00 ± 1.41 [2] |" in text
    assert "Best: alpha = 1, beta = 0.3 (96.00, n=2)." in text


def test_gpt2_score_is_geometric_mean_of_pruned_perplexities(tmp_path, job_configs, write_run):
    write_run(tmp_path / "r", _horst(job_configs[("gpt2", "horst")], 30.0, 1.0, 0), 40.0)
    scores = sweep.scores(read_runs([tmp_path]).frame)
    pruned = [40.0 * (1 + s) for s in job_configs[("gpt2", "horst")]["prune"]["sparsities"] if s >= 0.5]
    assert scores.score.iloc[0] == pytest.approx(np.exp(np.mean(np.log(pruned))))


def test_mixed_pipelines_are_refused(tmp_path, job_configs, write_run):
    write_run(tmp_path / "v", job_configs[("vit", "horst")], 0.9)
    write_run(tmp_path / "g", job_configs[("gpt2", "horst")], 40.0)
    with pytest.raises(NoRunsError, match="runs of several pipelines"):
        sweep.scores(read_runs([tmp_path]).frame)


def test_a_failed_run_makes_its_cell_worst_and_other_settings_are_other_grids(tmp_path, job_configs, write_run):
    horst = job_configs[("vit", "horst")]
    write_run(tmp_path / "good", _horst(horst, 3.0, 0.3, 0), 0.9)
    write_run(tmp_path / "other", _horst(horst, 3.0, 0.3, 0, epochs=7), 0.95)
    failed = tmp_path / "failed"
    failed.mkdir()
    record_failed_cell(
        failed, pipeline="vit", reason="loss is nan", exit_code=4, step=3, config=_horst(horst, 100.0, 0.3, 0)
    )
    cells = sweep.cells(sweep.scores(read_runs([tmp_path]).frame))
    assert cells.grid.nunique() == 2
    grid = cells[cells.alpha.isin([3.0, 100.0]) & (cells.n == 1)].groupby("grid").filter(lambda g: len(g) == 2)
    assert sweep.pick(grid, higher_is_better=True).alpha == 3.0 and grid[grid.alpha == 100.0].failed.iloc[0] == 1


def _sweep_table(*arguments) -> subprocess.CompletedProcess:
    return subprocess.run([HORST_SPARSE, "sweep-table", *map(str, arguments)], cwd=ROOT, capture_output=True, text=True)


def test_a_cancelled_cell_is_not_scored_and_a_seed_run_twice_counts_once(tmp_path, job_configs, write_run):
    """A cell SLURM cancelled (failed.json as horst-sparse status writes it) is listed, not ranked
    worst; the same alpha, beta and seed run twice is one replicate: [1], not [2] with ± 0.00."""
    horst = job_configs[("vit", "horst")]
    write_run(tmp_path / "a" / "3_0.3_s0", _horst(horst, 3.0, 0.3, 0), 0.90)
    write_run(tmp_path / "b" / "3_0.3_s0", _horst(horst, 3.0, 0.3, 0), 0.90)  # a second sweep, the same cell
    write_run(tmp_path / "a" / "10_0.3_s0", _horst(horst, 10.0, 0.3, 0), 0.85)
    record_failed_cell(
        tmp_path / "a" / "30_0.3_s0",
        pipeline="vit",
        reason="SLURM job 7_2 ended CANCELLED by 0 without a summary",
        exit_code=None,
        step=None,
        config=_horst(horst, 30.0, 0.3, 0),
        slurm_job_id="7_2",
        slurm_state="CANCELLED by 0",
    )
    done = _sweep_table(tmp_path, "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "out" / "sweep.md").read_text()
    assert "| 3 | **90.00 [1]** |" in text and "| 10 | 85.00 [1] |" in text
    assert "| 30 |" not in text and "not finite (" not in text
    assert "30_0.3_s0: cancelled (CANCELLED by 0, before it trained); no number" in text
    assert "one replicate, counted once" in text


def test_other_settings_are_grids_named_by_the_keys_that_differ(tmp_path, job_configs, write_run):
    """Two values of train.epochs are two grids, each titled by its value, not `grid 1`, `grid 2`."""
    horst = job_configs[("vit", "horst")]
    for epochs in (6, 8):
        for alpha in (3.0, 10.0):
            write_run(tmp_path / f"e{epochs}_a{alpha}", _horst(horst, alpha, 0.3, 0, epochs=epochs), 0.9)
    done = _sweep_table(tmp_path, "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    titles = [line for line in (tmp_path / "out" / "sweep.md").read_text().splitlines() if line.startswith("## ")]
    assert titles == ["## horst (train.epochs=6)", "## horst (train.epochs=8)"]


def test_sweep_table_leaves_tuning_trials_out_unless_asked(tmp_path, job_configs, write_run):
    horst = job_configs[("vit", "horst")]
    write_run(tmp_path / "vit" / "sweep" / "0", _horst(horst, 3.0, 0.3, 0), 0.9)
    write_run(tmp_path / "tuning" / "vit_digits_horst" / "0", _horst(horst, 10.0, 0.3, 100), 0.8)
    done = _sweep_table(tmp_path, "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert list(pd.read_csv(tmp_path / "out" / "sweep.csv").alpha) == [3.0]
    assert "1 tuning trial folder " in (tmp_path / "out" / "sweep.md").read_text()
    done = _sweep_table(tmp_path, "--out", tmp_path / "all", "--tuning")
    assert list(pd.read_csv(tmp_path / "all" / "sweep.csv").alpha) == [3.0, 10.0]
