"""horst_sparse.analysis.stats and horst_sparse.analysis.claims: intervals, Holm and power against published values, the
verdicts following the numbers by the rules of horst_sparse/analysis/claims.yaml, every output of one report
agreeing on each claim, and the README's headline block being the generated one."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import HORST_SPARSE, ROOT, record, vit_claim

from horst_sparse.analysis import claims, report, runs, tables
from horst_sparse.analysis.stats import detectable_effect, holm, paired_interval

RULES = claims.load_rules()


def test_paired_interval_against_the_t_table():
    interval = paired_interval([1, 2, 3, 4, 5], 0.95)
    half = 2.7764451051977987 * np.std([1, 2, 3, 4, 5], ddof=1) / np.sqrt(5)  # t(0.975, 4)
    assert (interval.mean, interval.n) == (3.0, 5)
    assert interval.low == pytest.approx(3 - half) and interval.high == pytest.approx(3 + half)
    assert np.isnan(paired_interval([1.0], 0.95).low)  # one pair: no interval


def test_holm_steps_down_and_skips_untested():
    assert holm([0.01, 0.04, 0.03, float("nan")])[:3] == pytest.approx([0.03, 0.06, 0.06])


def test_detectable_effect_is_detected_80_percent_of_the_time():
    """Simulated paired t-tests at the effect the power table states: 80 % reject (40,000 trials),
    and the effect scales with the spread (n = 10: d ~ 1.0, the textbook value)."""
    from scipy import stats

    effect = detectable_effect(2.0, 10, alpha=0.05, power=0.8)
    assert effect == pytest.approx(2 * detectable_effect(1.0, 10, alpha=0.05, power=0.8)) and 1.9 < effect < 2.1
    samples = np.random.default_rng(0).normal(effect, 2.0, size=(40_000, 10))
    rejected = stats.ttest_1samp(samples, 0.0, axis=1).pvalue < 0.05
    assert rejected.mean() == pytest.approx(0.8, abs=0.01)


@pytest.mark.parametrize(
    ("gains", "verdict"),
    [
        ({0.7: 0.5, 0.8: 1.5, 0.9: 2.0}, claims.REPRODUCED),
        ({0.7: 0.5, 0.8: 0.5, 0.9: -2.0}, claims.NOT_REPRODUCED),
        ({0.7: 1.0, 0.8: 1.0, 0.9: 1.0}, claims.INCONCLUSIVE),
    ],  # the gain does not grow: undecided
)
def test_claim_1_follows_the_numbers(gains, verdict):
    judgement = claims.judge(vit_claim(gains), RULES)
    verdicts = claims.verdicts(judgement, RULES).set_index("claim")["verdict"]
    assert verdicts["1"] == verdict
    assert verdicts["2"] == claims.NOT_TESTED  # no GPT-2 runs


def test_holm_can_turn_a_nominal_win_into_undecided():
    """Claim 1's family here has three testable endpoints (70 %, 90 %, the change): a gain at 90 %
    with p ~ 0.02 alone is no support once Holm multiplies it by three."""
    base = np.array([90.0, 91.0, 89.5, 90.5, 90.2])
    at_90, at_70 = np.array([0.2, 0.5, 0.8, 1.1, 0.4]), np.array([0.1, -0.2, 0.3, 0.0, 0.2])
    frame = record(
        {
            ("adamw", "top1", 0.9): list(base),
            ("horst", "top1", 0.9): list(base + at_90),
            ("adamw", "top1", 0.7): list(base),
            ("horst", "top1", 0.7): list(base + at_70),
        }
    )
    judgement = claims.judge(frame, RULES).set_index("endpoint")
    row = judgement.loc["horst − adamw at 90 %"]
    assert row.p < 0.05 < row.p_holm and row.p_holm == pytest.approx(3 * row.p)
    assert row.outcome == claims.UNDECIDED
    assert claims.verdicts(judgement.reset_index(), RULES).set_index("claim").loc["1", "verdict"] == claims.INCONCLUSIVE


def test_gpt2_ratio_and_widening():
    rng = np.random.default_rng(1)
    base = rng.normal(40, 2, 8)
    values = {}
    for sparsity, ratio in {0.0: 0.8, 0.5: 0.8, 0.9: 0.6}.items():
        values[("adamw", "ppl", sparsity)] = list(base * (1 + sparsity))
        values[("horst", "ppl", sparsity)] = list(base * (1 + sparsity) * ratio * np.exp(rng.normal(0, 0.01, 8)))
    judgement = claims.judge(record(values, pipeline="gpt2"), RULES).set_index("endpoint")
    widening = judgement.loc["horst / adamw: ratio at 90 % over ratio at 50 %"]
    assert np.exp(widening.estimate) == pytest.approx(0.75, rel=0.02) and widening.outcome == claims.SUPPORTS
    assert judgement.loc["horst / ham at 90 %", "outcome"] == claims.NOT_TESTABLE  # no HAM runs


def _verdicts_in(out: Path) -> dict[str, dict[str, str]]:
    """Each output's verdict per claim: claims.md, claims.csv, headline.md, README.md."""
    found = {}
    for name in ("claims.md", "headline.md"):
        text = (out / name).read_text()
        found[name] = dict(re.findall(r"^(?:- Claim )?(\w+)\.?:? \*\*([^*]+)\*\*", text, re.M))
    table = pd.read_csv(out / "claims.csv", dtype={"claim": str})
    found["claims.csv"] = dict(table.drop_duplicates("claim")[["claim", "verdict"]].itertuples(index=False))
    return found


def test_every_output_of_one_report_agrees_on_each_claim(tmp_path):
    frame = pd.concat(
        [
            vit_claim({0.7: 0.5, 0.8: 1.5, 0.9: 2.0}),
            record({("adamw", "ppl", 0.9): [80, 82, 79], ("horst", "ppl", 0.9): [60, 59, 62]}, pipeline="gpt2"),
        ]
    )
    report.write_report(frame, tmp_path)
    found = _verdicts_in(tmp_path)
    assert found["claims.md"] == found["claims.csv"] == found["headline.md"]
    assert set(found["claims.md"]) == {c["id"] for c in RULES["claims"]}
    assert "supports" not in (tmp_path / "paired.md").read_text()  # only the judge's outputs judge


def test_a_report_leaves_no_file_of_an_earlier_one(tmp_path):
    """A pipeline without runs has no tables or figure: the files an earlier report wrote for it go."""
    gpt2 = record({("adamw", "ppl", 0.9): [80, 82, 79], ("horst", "ppl", 0.9): [60, 59, 62]}, pipeline="gpt2")
    report.write_report(pd.concat([vit_claim({0.7: 0.5, 0.8: 1.5, 0.9: 2.0}), gpt2]), tmp_path)
    assert (tmp_path / "gpt2_ppl.csv").exists() and (tmp_path / "perplexity_vs_sparsity.png").exists()
    (tmp_path / "pilot.md").write_text("not the report's\n")
    report.write_report(vit_claim({0.7: 0.5, 0.8: 1.5, 0.9: 2.0}), tmp_path)
    assert not (tmp_path / "gpt2_ppl.csv").exists() and not (tmp_path / "perplexity_vs_sparsity.png").exists()
    assert (tmp_path / "vit_top1.csv").exists() and (tmp_path / "pilot.md").exists()


def assert_same_table(written: Path, committed: Path) -> None:
    """Verdicts, cells, counts, seeds and runs exactly; numbers to the results' precision (another
    CPU may round the last kept digit the other way)."""
    new, old = pd.read_csv(written), pd.read_csv(committed)
    assert list(new.columns) == list(old.columns) and len(new) == len(old), committed.name
    for column in new.columns:
        if pd.api.types.is_float_dtype(new[column]) and pd.api.types.is_float_dtype(old[column]):
            np.testing.assert_allclose(
                new[column],
                old[column],
                rtol=10.0 ** (1 - tables.SIGNIFICANT_DIGITS),
                equal_nan=True,
                err_msg=f"{committed.name}: {column}",
            )
        else:
            assert new[column].tolist() == old[column].tolist(), f"{committed.name}: {column}"


def test_results_files_keep_the_same_digits_on_every_cpu(tmp_path):
    """Two CPUs that differ in a mean's last bit write the same CSV; the rule is stated once."""
    one, other = 0.9093138180053932, 0.9093138180053931  # results/embedded/paired.csv on two CPUs
    for name, value in (("a.csv", one), ("b.csv", other)):
        tables.write_csv(pd.DataFrame({"low": [value], "arm": ["horst"]}), tmp_path / name)
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text() == "low,arm\n0.909313818,horst\n"


def _written(folder: Path) -> set[str]:
    """A report's text files, its tables' CSV and LaTeX included."""
    tables = {p.name for suffix in ("*.tex", "*.csv") for p in folder.glob(suffix) if p.name != "runs.csv"}
    return tables | {n for n in report.OUTPUTS if (folder / n).exists() and not n.endswith(".png") and n != "README.md"}


def _same_report(written: Path, committed: Path) -> None:
    texts = _written(written)
    assert texts == _written(committed)
    for name in texts:
        if name.endswith(".csv"):
            assert_same_table(written / name, committed / name)
        else:  # markdown, LaTeX, JSON: rounded to their decimals, so the same text on every CPU
            assert (written / name).read_text() == (committed / name).read_text(), name


@pytest.mark.parametrize("folder", ["results/embedded", "results/demo"])
def test_committed_outputs_agree_and_regenerate_from_the_record(tmp_path, folder):
    """The committed folders are what the package writes from their committed runs.csv (and the
    weight figure's histograms, kept in the folder: no run folders here), and agree. A study with
    protocol versions has one report per version (v<N>/, by its own rules) and every version's
    verdicts in its claims.md and headline.md."""
    from horst_sparse.study import protocol
    from horst_sparse.study.report import label, repeats, write_versions_report

    committed = ROOT / folder
    frame = runs.read_record([committed / "runs.csv"])
    split = frame.eval_split.unique()[0]
    if "protocol" in frame:
        versions = protocol.versions(Path(folder).name)
        for version in versions:
            saved = committed / f"v{version.version}" / report.WEIGHT_HISTOGRAMS
            if saved.is_file():
                (tmp_path / f"v{version.version}").mkdir()
                shutil.copy(saved, tmp_path / f"v{version.version}")
        write_versions_report(frame, tmp_path, versions, split=split, folders={}, source=f"{folder}/runs.csv", intro="")
        reports = [committed / f"v{version}" for version in sorted(set(frame.protocol.astype(int)))]
        repeated = repeats(frame, versions)
        for version in reports:
            _same_report(tmp_path / version.name, version)
            number = int(version.name[1:])
            labelled = f"**Protocol {label(versions[number - 1], repeated.get(number, {}))}**"
            assert labelled in (committed / "headline.md").read_text()
            assert (version / "claims.md").read_text() in (committed / "claims.md").read_text()
        for name in ("claims.md", "headline.md", "plain.md"):
            assert (tmp_path / name).read_text() == (committed / name).read_text()
    else:
        if (committed / report.WEIGHT_HISTOGRAMS).is_file():
            shutil.copy(committed / report.WEIGHT_HISTOGRAMS, tmp_path)
        report.write_report(frame, tmp_path, split=split, source=f"{folder}/runs.csv")
        _same_report(tmp_path, committed)
        reports = [committed]
    for one in reports:
        assert _verdicts_in(one)["claims.md"] == _verdicts_in(one)["headline.md"] == _verdicts_in(one)["claims.csv"]
    assert (committed / "headline.md").read_text() in (committed / "README.md").read_text()


@pytest.mark.parametrize(
    "name, start, end",
    [("headline.md", report.HEADLINE_START, report.HEADLINE_END), ("plain.md", report.PLAIN_START, report.PLAIN_END)],
)
def test_the_readme_blocks_are_the_generated_ones(name, start, end):
    """The headline and the plain reading in README.md are results/embedded's, as generated."""
    block = report.readme_block((ROOT / "README.md").read_text(), start, end)
    assert block is not None, f"README.md has no block {start}: paste results/embedded/{name} there"
    assert block == (ROOT / "results" / "embedded" / name).read_text()


def test_study_report_on_the_command_line(tmp_path):
    record_file = tmp_path / "runs.csv"
    runs.write_record(vit_claim({0.7: 0.5, 0.8: 1.5, 0.9: 2.0}), record_file)
    done = subprocess.run(
        [HORST_SPARSE, "study-report", str(record_file), "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "1. **reproduced**" in done.stdout
    wrong = subprocess.run(
        [
            HORST_SPARSE,
            "study-report",
            str(record_file),
            "--out",
            str(tmp_path / "x"),
            "--split",
            "validation",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert wrong.returncode == 1 and wrong.stderr.strip() == (
        "error: no run measured on the validation split (the runs have eval_split test); pass --split to report those"
    )


@pytest.mark.slow  # ~2 min: a tiny ViT and a tiny GPT-2 run of the real pipelines
def test_real_run_folders_through_the_whole_report(tmp_path, monkeypatch, compose):
    """The real summary.json, config.yaml, metrics.jsonl and weight_histogram.json: every number of
    both pipelines in the frame (Wanda and 2:4 beside magnitude, claim 3's weight numbers), the
    record round trip, and all three figures."""
    import torch
    from omegaconf import OmegaConf

    from horst_sparse.gpt2.data import prepare_pydoc
    from horst_sparse.gpt2.run import run as run_gpt2
    from horst_sparse.vit.run import run as run_vit

    monkeypatch.setenv("WANDB_MODE", "disabled")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        vit = compose(
            "vit",
            [
                "experiment=adamw",
                "device=cpu",
                "eval_split=test",
                "train.epochs=5",
                "train.warmup_epochs=1",
                "train.batch_size=256",
                "acdc.dense_warmup=1",
                "acdc.compressed=1",
                "acdc.decompressed=1",
                "acdc.final_decompressed=1",
                "acdc.final_compressed=2",
            ],
        )
        run_vit(OmegaConf.create(vit), run_dir=tmp_path / "runs" / "vit")
        prepare_pydoc(tmp_path / "pydoc")
        gpt2 = compose(
            "gpt2",
            [
                "experiment=horst",
                "model=gpt2_nano",
                f"data.dir={tmp_path / 'pydoc'}",
                "device=cpu",
                "eval_split=test",
                "train.max_steps=4",
                "train.warmup_steps=1",
                "train.batch_size=2",
                "train.micro_batch_size=2",
                "train.eval_interval=4",
                "train.eval_windows=4",
                "eval.max_windows=8",
                "prune.sparsities=[0.0,0.5,0.9]",
                "prune.methods=[magnitude,wanda]",
                'prune.patterns=[unstructured,"2:4"]',
                "prune.calibration_windows=4",
            ],
        )
        run_gpt2(OmegaConf.create(gpt2), run_dir=tmp_path / "runs" / "gpt2")
    finally:
        torch.set_num_threads(threads)
    found = runs.read_runs([tmp_path / "runs"])
    frame = found.frame
    assert set(frame.eval_split) == {"test"} and set(frame.arm) == {"adamw", "horst"}
    methods = set(map(tuple, frame[frame.pipeline == "gpt2"][["method", "pattern"]].drop_duplicates().to_numpy()))
    assert methods == {
        ("none", "dense"),
        ("magnitude", "unstructured"),
        ("wanda", "unstructured"),
        ("magnitude", "2:4"),
        ("wanda", "2:4"),
    }
    assert {"weights_median_log10", "weights_below_1e-3"} <= set(frame.metric)
    report.write_report(frame, tmp_path / "out", folders=found.folders)
    table = (tmp_path / "out" / "tables.md").read_text()
    assert "wanda 2:4" in table and "magnitude 2:4" in table and "| 90 % |" in table
    for figure in ("accuracy_vs_sparsity.png", "perplexity_vs_sparsity.png", "weight_distribution.png"):
        assert (tmp_path / "out" / figure).read_bytes().startswith(b"\x89PNG")
    runs.write_record(frame, tmp_path / "runs.csv")
    assert len(runs.read_record([tmp_path / "runs.csv"])) == len(frame)


def test_each_set_of_runs_has_one_label_and_the_headline_shows_it_once():
    """A version whose runs of a pipeline are an earlier version's (the same runs at the same
    commits: v6's ViT runs are v5's) is labelled so, and its headline points to that version for the
    pipeline's claims instead of showing the same numbers twice."""
    from horst_sparse.study import protocol
    from horst_sparse.study.report import repeats

    frame = runs.read_record([ROOT / "results" / "embedded" / "runs.csv"])
    versions = protocol.versions("embedded")
    assert repeats(frame, versions) == {2: {"vit": 1}, 6: {"vit": 5}}
    headline = (ROOT / "results" / "embedded" / "headline.md").read_text()
    assert "**Protocol v6 (confirmatory for its new runs; vit: v5's runs)**" in headline
    assert "- Claim 1: v5's runs (shown under v5)" in headline and headline.count("+2.51 [-0.48, +5.50]") == 1
