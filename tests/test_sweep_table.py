"""scripts/sweep_table.py: the alpha x beta grid, mean over the seeds of one experiment
signature, the pick and its rule, failed runs in their cell and listed."""

from __future__ import annotations

import csv
import importlib.util
import math
import sys
from pathlib import Path

import pytest

from test_make_tables import optimizer, vit_config, write_failed_run, write_gpt2_run, write_vit_run  # the pipelines' formats

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sweep_table.py"
_spec = importlib.util.spec_from_file_location("sweep_table", SCRIPT)
sweep_table = importlib.util.module_from_spec(_spec)
sys.modules["sweep_table"] = sweep_table
_spec.loader.exec_module(sweep_table)


def test_vit_grid_mean_over_seeds_and_pick(tmp_path, capsys):
    top1 = {(3.0, 0.1): [0.90, 0.92], (3.0, 1.0): [0.95, 0.97], (10.0, 0.1): [0.99, 0.85], (10.0, 1.0): [None, None]}
    for (alpha, beta), values in top1.items():
        for seed, value in enumerate(values):
            write_vit_run(tmp_path / "runs" / f"a{alpha}_b{beta}_s{seed}",
                          opt=optimizer("horst", alpha=alpha, beta=beta), top1=value, seed=seed)  # fmt: skip
    write_vit_run(tmp_path / "runs" / "adamw", opt=optimizer("adamw"), top1=0.99)  # no alpha: not in the grid
    sweep_table.main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    text = (tmp_path / "out" / "sweep.md").read_text()
    assert capsys.readouterr().out.strip() == text.strip()
    assert "| 3 | 91.00 ± 1.41 [n=2] | **96.00 ± 1.41 [n=2]** |" in text  # best mean, not best single run
    assert "| 10 | 92.00 ± 9.90 [n=2] | not finite 2 of 2 [n=2] |" in text  # diverged: never the pick
    assert "Best: alpha = 3, beta = 1 (96.00 ± 1.41 over 2 runs)" in text
    assert "## Runs in no grid (1: no alpha/beta)" in text and "adamw, seed 0, score 99.00" in text
    with open(tmp_path / "out" / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["alpha"], r["beta"], r["runs"]) for r in rows] == [
        ("3.0", "0.1", "2"), ("3.0", "1.0", "2"), ("10.0", "0.1", "2"), ("10.0", "1.0", "2")
    ]  # fmt: skip


def test_gpt2_score_is_geometric_mean_of_pruned_perplexities(tmp_path):
    # SPARSITIES of the writer: 0, 0.5, 0.9; the dense perplexity must not count
    write_gpt2_run(tmp_path / "a", opt=optimizer("ham", alpha=50.0, beta=1e-3), ppl=[1.0, 20.0, 80.0])
    write_gpt2_run(tmp_path / "b", opt=optimizer("ham", alpha=200.0, beta=1e-3), ppl=[100.0, 30.0, 40.0])
    runs = sweep_table.find_runs([tmp_path])
    pipeline, cells = sweep_table.collect(runs)
    assert pipeline == "gpt2"
    assert [round(c.mean, 6) for c in cells] == [40.0, round(math.sqrt(1200.0), 6)]
    assert sweep_table.best(cells, higher_is_better=False).alpha == 200.0


def test_mixed_pipelines_are_refused(tmp_path):
    write_gpt2_run(tmp_path / "g", opt=optimizer("horst"), ppl=[1.0, 2.0, 3.0])
    write_vit_run(tmp_path / "v", opt=optimizer("horst"), top1=0.9)
    with pytest.raises(SystemExit, match="several pipelines"):
        sweep_table.main([str(tmp_path), "--out", str(tmp_path / "out")])


def test_other_settings_form_separate_grids_not_one_cell(tmp_path, capsys):
    """Issue 14: a 6-epoch and a 40-epoch run of seed 0 were merged into "87.78 ± 14.93 [2]"."""
    write_vit_run(tmp_path / "runs" / "e6", opt=optimizer("horst", alpha=3.0, beta=0.3), top1=0.7722, epochs=6)
    write_vit_run(tmp_path / "runs" / "e40", opt=optimizer("horst", alpha=3.0, beta=0.3), top1=0.9833, epochs=40)
    sweep_table.main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    text = (tmp_path / "out" / "sweep.md").read_text()
    assert "## horst [train.epochs=40]" in text and "## horst [train.epochs=6]" in text
    assert "| 3 | **98.33 [n=1]** |" in text and "| 3 | **77.22 [n=1]** |" in text
    assert "[n=2]" not in text and "± 0.00" not in text
    assert "Best: alpha = 3, beta = 0.3 (98.33 over 1 run)" in text


def test_failed_runs_count_as_worst_and_are_listed(tmp_path):
    write_vit_run(tmp_path / "runs" / "ok", opt=optimizer("horst", alpha=3.0, beta=0.3), top1=0.90)
    write_vit_run(tmp_path / "runs" / "ok1", opt=optimizer("horst", alpha=30.0, beta=0.3), top1=0.95, seed=1)
    write_failed_run(tmp_path / "runs" / "bad", config=vit_config(opt=optimizer("horst", alpha=30.0, beta=0.3)),
                     pipeline="vit", reason="non-finite loss (inf)", step=40)  # fmt: skip
    sweep_table.main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    text = (tmp_path / "out" / "sweep.md").read_text()
    assert "| 3 | **90.00 [n=1]** |" in text
    assert "| 30 | not finite 1 of 2 (1 failed) [n=2] |" in text
    assert "## Failed runs (1)" in text and "seed 0: exit code 4, step 40: non-finite loss (inf)" in text
    assert "vit_tiny" not in text  # the header names the finished runs' model preset
    with open(tmp_path / "out" / "sweep.csv", newline="") as f:
        rows = {r["alpha"]: r for r in csv.DictReader(f)}
    assert rows["30.0"]["failed"] == "1" and rows["3.0"]["score_std"] == ""
