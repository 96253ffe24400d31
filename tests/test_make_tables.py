"""horst_sparse.analysis.runs and horst_sparse.analysis.tables: run folders into one tidy frame, cells over seeds that
differ only in keys that change no number, labels that are what ran, the record round trip,
the tables' text, LaTeX and figures, and horst-sparse tables on the command line."""

from __future__ import annotations

import copy
import json
import subprocess

import pandas as pd
import pytest
from conftest import HORST_SPARSE, ROOT

from horst_sparse.analysis import report, runs, tables
from horst_sparse.training.runner import record_failed_cell


def _with(config: dict, **changes) -> dict:
    """A deep copy of `config` with dotted keys set."""
    config = copy.deepcopy(config)
    for key, value in changes.items():
        node, *path, leaf = [config, *key.split(".")]
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return config


def test_vit_seeds_with_data_root_elsewhere_are_one_cell(tmp_path, job_configs, write_run):
    """Three ViT seeds, one staged under another data.root (per-job staging on a cluster): n=3."""
    horst = job_configs[("vit", "horst")]
    for seed, root in ((0, None), (1, None), (2, "/scratch/job4242/digits")):
        write_run(tmp_path / f"seed{seed}", _with(horst, seed=seed, **{"data.root": root}), 0.9 + seed / 100)
    cells = tables.cells(runs.read_runs([tmp_path]).frame)
    assert len(cells) == 1
    cell = cells.iloc[0]
    assert (cell.n, cell.seeds, cell.arm, cell.metric) == (3, "0;1;2", "horst", "top1")
    assert cell["mean"] == pytest.approx(91.0) and cell["std"] == pytest.approx(1.0)


def test_gpt2_seeds_with_a_copy_of_the_tokens_and_an_export_are_one_cell(tmp_path, job_configs, write_run):
    """Two GPT-2 seeds, one reading a copy of the tokens (data.dir) with export.enabled=true: n=2."""
    adamw = job_configs[("gpt2", "adamw")]
    write_run(tmp_path / "a", _with(adamw, seed=0), 40.0)
    write_run(tmp_path / "b", _with(adamw, seed=1, **{"data.dir": "/tmp/copy/pydoc", "export.enabled": True}), 42.0)
    cells = tables.cells(runs.read_runs([tmp_path]).frame)
    assert set(cells.n) == {2} and len(cells) == len(adamw["prune"]["sparsities"])
    dense = cells[cells.pattern == "dense"].iloc[0]
    assert dense["mean"] == pytest.approx(41.0)


def test_each_cell_lists_its_own_runs_and_seeds_whatever_order_the_rows_come_in():
    """Cells first seen out of their sorted order (a control's cell between two of the arm it
    controls, as in a study's record) still name their own runs and seeds, beside their own mean."""
    keys = dict(
        pipeline="vit",
        data="mnist1d",
        model="vit_mnist1d",
        eval_split="test",
        metric="top1",
        method="acdc",
        pattern="unstructured",
    )
    rows = [
        dict(
            keys,
            arm=arm,
            signature=arm[:4],
            sparsity=sparsity,
            seed=seed,
            run=f"{arm}/s{sparsity}/seed{seed}",
            value=value + seed,
        )
        for arm, sparsity, seeds, value in (
            ("adamw", 0.9, (0, 1, 2), 50.0),
            ("horst_sm", 0.9, (3, 4), 10.0),
            ("adamw", 0.7, (5, 6), 70.0),
        )
        for seed in seeds
    ]
    cells = tables.cells(pd.DataFrame(rows))
    for cell in cells.itertuples():
        folders = cell.runs.split(";")
        assert all(f.startswith(f"{cell.arm}/s{cell.sparsity}/") for f in folders), cell
        seeds = [int(f.rsplit("seed", 1)[1]) for f in folders]
        assert cell.seeds == ";".join(map(str, sorted(seeds))) and cell.n == len(seeds)
        assert cell.mean == pytest.approx(min(r["value"] for r in rows if r["run"] in folders) + (len(seeds) - 1) / 2)


def test_a_key_that_changes_the_numbers_splits_the_cell(tmp_path, job_configs, write_run):
    horst = job_configs[("vit", "horst")]
    write_run(tmp_path / "a", _with(horst, seed=0), 0.9)
    write_run(tmp_path / "b", _with(horst, seed=1, **{"train.epochs": 7}), 0.8)
    cells = tables.cells(runs.read_runs([tmp_path]).frame)
    assert list(cells.n) == [1, 1]
    wide = tables.wide(cells)
    epochs = horst["train"]["epochs"]
    # two rows, each named by the key that differs (not a hash), in the order of its values
    assert list(wide["setting"]) == sorted([f"train.epochs={epochs}", "train.epochs=7"], key=lambda t: int(t[13:]))


def test_a_label_that_is_not_what_ran_is_refused(tmp_path, job_configs, write_run, capsys):
    """optimizer.name=sgd over horst.HORST, and arm=adamw over HORST: left out, in one line each."""
    horst = job_configs[("gpt2", "horst")]
    write_run(tmp_path / "sgd", _with(horst, **{"optimizer.name": "sgd"}), 40.0)
    write_run(tmp_path / "arm", _with(horst, arm="adamw"), 40.0)
    write_run(tmp_path / "ok", horst, 40.0)
    found = runs.scan([tmp_path])
    assert set(found.frame.run) == {str(tmp_path / "ok")}
    why = sorted(found.left_out)
    assert "records arm=adamw but ran optimizer horst (the arm's is adamw)" in why[0]
    assert "records optimizer.name=sgd but ran horst.HORST" in why[1]


def test_runs_without_an_arm_are_labelled_by_what_ran(tmp_path, job_configs, write_run):
    """One name per variant: HORST in order "sm" is `horst_sm` whether or not the run recorded an arm."""
    horst = {k: v for k, v in job_configs[("vit", "horst")].items() if k != "arm"}
    write_run(tmp_path / "a", _with(horst, **{"optimizer.order": "sm"}), 0.9)
    write_run(tmp_path / "b", _with(job_configs[("vit", "horst")], arm="horst_sm", **{"optimizer.order": "sm"}), 0.9)
    frame = runs.read_runs([tmp_path]).frame
    assert set(frame.arm) == {"horst_sm"}


def test_a_diverged_run_counts_in_its_cell_and_an_unfinished_one_is_listed(tmp_path, job_configs, write_run):
    horst = job_configs[("vit", "horst")]
    write_run(tmp_path / "ok", horst, 0.9)
    failed = tmp_path / "failed"
    failed.mkdir()
    record_failed_cell(failed, pipeline="vit", reason="loss is nan", exit_code=4, step=3, config=_with(horst, seed=1))
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text("seed: 2\n")
    found = runs.scan([tmp_path])
    assert any("diverged (non-finite loss, exit code 4 at step 3: loss is nan)" in w for w in found.left_out)
    assert any("unfinished" in w for w in found.left_out)
    cell = next(tables.cells(found.frame).itertuples())
    assert (cell.n, cell.diverged) == (1, 1)
    assert tables.cell_text(cell, 2) == "90.00 [diverged 1]"


def test_the_record_gives_the_frame_the_folders_give(tmp_path, job_configs, write_run):
    for seed in range(2):
        write_run(tmp_path / "runs" / f"s{seed}", _with(job_configs[("gpt2", "horst")], seed=seed), 40.0 + seed)
    frame = runs.read_runs([tmp_path / "runs"]).frame
    runs.write_record(frame, tmp_path / "runs.csv")
    again = runs.read_record([tmp_path / "runs.csv"])
    columns = ["run", "arm", "seed", "metric", "method", "pattern", "sparsity", "value", "signature"]
    pd.testing.assert_frame_equal(
        tables.cells(frame[runs.RECORD_COLUMNS]).drop(columns="runs"),
        tables.cells(again).drop(columns="runs"),
        check_dtype=False,
    )
    assert len(again) == len(frame) and set(again.columns) >= set(columns)


def test_cell_text_rounds_once_and_one_run_has_no_spread():
    two, one = pd.DataFrame(
        {"mean": [71.004, 65.0], "std": [1.414, float("nan")], "n": [2, 1], "diverged": [0, 0]}
    ).itertuples()
    assert tables.cell_text(two, 2) == "71.00 ± 1.41" and tables.cell_text(one, 2) == "65.00"
    assert (
        tables.column_label("wanda", "2:4", 0.5) == "wanda 2:4"
        and tables.column_label("acdc", "unstructured", 0.995) == "99.5 %"
    )


def test_make_tables_writes_tables_latex_and_readable_figures(tmp_path, job_configs, write_run):
    """On the command line: the tables, LaTeX, CSVs and both figures; the figure titles name the
    arms that ran (not a fixed "AdamW vs HAM vs HORST")."""
    for arm in ("adamw", "horst"):
        for sparsity in (0.9, 0.98, 0.99, 0.995):
            for seed in range(2):
                config = _with(job_configs[("vit", arm)], seed=seed, **{"acdc.sparsity": sparsity})
                write_run(tmp_path / "runs" / arm / f"s{sparsity}" / f"seed{seed}", config, 0.95 - sparsity / 10)
    out = tmp_path / "out"
    done = subprocess.run(
        [HORST_SPARSE, "tables", str(tmp_path / "runs"), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    text = (out / "tables.md").read_text()
    assert "| digits | vit_digits | horst |" in text and "| 99.5 % |" in text
    assert r"\begin{table}[t]" in (out / "vit_top1.tex").read_text() and r"$\pm$" in (out / "vit_top1.tex").read_text()
    assert pd.read_csv(out / "vit_top1.csv")["n"].eq(2).all()
    assert (out / "accuracy_vs_sparsity.png").read_bytes().startswith(b"\x89PNG")
    assert "ham" not in (out / "headline.md").read_text()


def test_the_weight_figure_titles_do_not_collide(tmp_path, job_configs, write_run):
    """Two panels from real histogram files: each title sits inside its own panel."""
    import matplotlib

    matplotlib.use("Agg")

    from horst_sparse.analysis import figures

    for pipeline, arm in (("vit", "adamw"), ("vit", "horst"), ("gpt2", "adamw"), ("gpt2", "horst")):
        folder = write_run(tmp_path / pipeline / arm, job_configs[(pipeline, arm)], 0.9 if pipeline == "vit" else 40.0)
        counts = [1, 5, 20, 5, 1] if arm == "adamw" else [10, 8, 5, 3, 1]
        (folder / "weight_histogram.json").write_text(json.dumps({"counts": counts, "edges": [-5, -4, -3, -2, -1, 0]}))
    found = runs.read_runs([tmp_path])
    assert set(found.frame.metric) >= {"weights_median_log10", "weights_below_1e-3"}  # claim 3's numbers
    notes, _ = figures.weight_figure(found.frame, found.folders, tmp_path / "w.png")
    assert len([n for n in notes if "weight_histogram.json" in n]) == 4
    assert (tmp_path / "w.png").read_bytes().startswith(b"\x89PNG")


def test_the_weight_figure_is_redrawn_from_the_report_without_run_folders(tmp_path, job_configs, write_run):
    """A study resumed from its record (no run folders on this machine) redraws the committed
    weight figure from the report's weight_histograms.json, the same bytes; a run the record holds
    with another config than the saved histogram's is not drawn from it."""
    for arm in ("adamw", "horst"):
        folder = write_run(tmp_path / "runs" / arm, job_configs[("gpt2", arm)], 40.0)
        counts = [1, 5, 20, 5, 1] if arm == "adamw" else [10, 8, 5, 3, 1]
        (folder / "weight_histogram.json").write_text(json.dumps({"counts": counts, "edges": [-5, -4, -3, -2, -1, 0]}))
    found = runs.read_runs([tmp_path / "runs"])
    out = tmp_path / "out"
    report.write_report(found.frame, out, split="validation", folders=found.folders)
    figure = (out / "weight_distribution.png").read_bytes()
    assert set(json.loads((out / "weight_histograms.json").read_text())) == set(found.folders)

    runs.write_record(found.frame, tmp_path / "runs.csv")
    record = runs.read_record([tmp_path / "runs.csv"])
    report.write_report(record, out, split="validation")
    assert (out / "weight_distribution.png").read_bytes() == figure

    record.loc[record.arm == "horst", "signature"] = "0123456789"  # horst rerun with other settings
    report.write_report(record, out, split="validation")
    drawn = json.loads((out / "weight_histograms.json").read_text())
    assert list(drawn) == [r for r in found.folders if "adamw" in r]


def test_report_reads_one_split(tmp_path, job_configs, write_run):
    write_run(tmp_path / "v", job_configs[("vit", "horst")], 0.9)
    frame = runs.read_runs([tmp_path]).frame
    with pytest.raises(runs.NoRunsError, match="no run measured on the test split.*--split"):
        report.select_split(frame, "test")


def _make_tables(*arguments) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HORST_SPARSE, "tables", *map(str, arguments)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def test_gpt2_columns_come_in_sparsity_order_whatever_sparsities_each_run_had(tmp_path, job_configs, write_run):
    """Two arms pruned at different sparsities: the columns are dense, 50, 60, 70, 80, 90 %
    (not the first arm's, then the second's)."""
    for arm, sparsities in (("adamw", [0.0, 0.5, 0.9]), ("horst", [0.0, 0.6, 0.7, 0.8])):
        write_run(tmp_path / "runs" / arm, _with(job_configs[("gpt2", arm)], **{"prune.sparsities": sparsities}), 40.0)
    done = _make_tables(tmp_path / "runs", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    header = next(line for line in (tmp_path / "out" / "tables.md").read_text().splitlines() if "| dense |" in line)
    assert header == "| data | model | arm | dense | 50 % | 60 % | 70 % | 80 % | 90 % | n |"


def test_an_alpha_beta_grid_is_one_row_per_setting_named_by_alpha_and_beta(tmp_path, job_configs, write_run):
    """The README's alpha x beta grid through horst-sparse tables: rows named `optimizer.alpha=..,
    optimizer.beta=..` in the order of their values, exit 0, the claims not judged in one line."""
    horst = job_configs[("vit", "horst")]
    for alpha in (10.0, 3.0):
        for beta in (0.3, 0.03):
            for seed in (0, 1):
                config = _with(horst, seed=seed, **{"optimizer.alpha": alpha, "optimizer.beta": beta})
                write_run(tmp_path / "runs" / f"a{alpha}_b{beta}_s{seed}", config, 0.9)
    done = _make_tables(tmp_path / "runs", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    settings = list(pd.read_csv(tmp_path / "out" / "vit_top1.csv").setting)
    assert settings == [
        "optimizer.alpha=3, optimizer.beta=0.03",
        "optimizer.alpha=3, optimizer.beta=0.3",
        "optimizer.alpha=10, optimizer.beta=0.03",
        "optimizer.alpha=10, optimizer.beta=0.3",
    ]
    (claims_line,) = [line for line in done.stdout.splitlines() if line.startswith("claims")]
    assert claims_line.startswith("claims not judged: these runs are not one study: vit horst ran 4 settings")


def test_tuning_trials_are_left_out_unless_asked(tmp_path, job_configs, write_run, compose):
    """`horst-sparse tables multirun/` leaves out horst-sparse tune's trials (below multirun/tuning/, or whose
    config sets tune_over, or whose Hydra overrides select hparams_search) and says how many;
    --tuning includes them; a folder named inside tuning/ is what was asked for."""
    multirun = tmp_path / "multirun"
    write_run(multirun / "vit" / "2026-12-01_10-00-00" / "0_run", job_configs[("vit", "adamw")], 0.9)
    trial = compose("vit", ["+hparams_search=vit_adamw"])  # sets tune_over: its cells are folders of the trial's
    write_run(multirun / "tuning" / "vit_digits_adamw" / "stamp" / "0" / "acdc.sparsity=0.7", trial, 0.8)
    elsewhere = multirun / "gpt2" / "2026-12-01_11-00-00" / "0_trial"
    write_run(elsewhere, compose("gpt2", ["+hparams_search=gpt2_adamw"]), 40.0)
    (elsewhere / ".hydra").mkdir()
    (elsewhere / ".hydra" / "overrides.yaml").write_text("- +hparams_search=gpt2_adamw\n- seed=100\n")
    done = _make_tables(multirun, "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert pd.read_csv(tmp_path / "out" / "runs.csv").run.nunique() == 1
    assert "2 tuning trial folders" in done.stderr and "--tuning includes them" in done.stderr
    done = _make_tables(multirun, "--out", tmp_path / "all", "--tuning")
    assert done.returncode == 0, done.stderr
    assert pd.read_csv(tmp_path / "all" / "runs.csv").run.nunique() == 3
    done = _make_tables(multirun / "tuning", "--out", tmp_path / "tuning")
    assert done.returncode == 0, done.stderr
    assert pd.read_csv(tmp_path / "tuning" / "runs.csv").run.nunique() == 1


def test_claims_none_of_which_is_testable_are_one_line(tmp_path, job_configs, write_run):
    """Two arms at one seed are one study, judged, but no endpoint has two seeds: one line says
    so (claims.md still lists every endpoint), not some 40 lines of `not testable`."""
    for arm in ("adamw", "horst"):
        write_run(tmp_path / "runs" / arm, job_configs[("vit", arm)], 0.9)
    done = _make_tables(tmp_path / "runs", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "not testable" not in done.stdout
    assert [line for line in done.stdout.splitlines() if line.startswith("claims")] == [
        f"claims: none testable on these runs (an endpoint needs two seeds of both arms it compares); "
        f"{tmp_path / 'out'}/claims.md lists them"
    ]
    assert "not testable" in (tmp_path / "out" / "claims.md").read_text()
