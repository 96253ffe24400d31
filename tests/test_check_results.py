"""horst_sparse.analysis.reruns (and study.check): a record made in the reproducible CPU mode is judged bit for bit; one made
without it, by reruns against its committed seeds' spread, a diverged run ranked worst."""

from __future__ import annotations

import math
from itertools import combinations

import pandas as pd
import pytest

from horst_sparse.analysis import reruns
from horst_sparse.study import check

NAN = math.nan


def rows(values, *, metric="top1", method="acdc", pattern="unstructured", sparsity=0.9, first_seed=10, mode=False):
    return pd.DataFrame(
        {
            "run": [f"runs/seed{first_seed + i}" for i in range(len(values))],
            "seed": [first_seed + i for i in range(len(values))],
            "metric": metric,
            "method": method,
            "pattern": pattern,
            "sparsity": sparsity,
            "value": values,
            "reproducible_cpu": mode,
        }
    )


COMMITTED = [81.2, 83.0, 79.5, 84.1, 82.2, 80.9, 83.7, 82.8, 81.5, 85.0]


def test_the_rank_test_is_exact_over_every_split():
    # all 3 reruns below all 10 committed: the 2 most extreme of C(13, 3) splits (one on each side)
    assert reruns.rank_test(COMMITTED, [70.0, 71.0, 72.0], higher_is_better=True) == pytest.approx(2 / 286)
    assert reruns.rank_test(COMMITTED, [90.0, 91.0, 92.0], higher_is_better=True) == pytest.approx(2 / 286)
    assert reruns.rank_test(COMMITTED, [81.0, 83.1, 82.5], higher_is_better=True) > 0.5
    # the p of a split is the share of splits at least as far from the middle (by brute force here)
    pooled = [*COMMITTED, 78.0, 80.0, 86.0]
    ranks = pd.Series(pooled).rank().tolist()
    mean = sum(ranks) / len(ranks)
    far = abs(sum(ranks[-3:]) / 3 - mean)
    brute = sum(abs(sum(s) / 3 - mean) >= far - 1e-12 for s in combinations(ranks, 3)) / 286
    assert reruns.rank_test(COMMITTED, [78.0, 80.0, 86.0], higher_is_better=True) == pytest.approx(brute)


def test_a_diverged_run_ranks_worst_on_either_metric():
    assert reruns.rank_test(COMMITTED, [NAN, NAN, NAN], higher_is_better=True) == pytest.approx(2 / 286)
    ppl = [60.0 + i for i in range(10)]
    assert reruns.rank_test(ppl, [NAN, NAN, NAN], higher_is_better=False) == pytest.approx(2 / 286)
    # one diverged rerun among ordinary ones is no verdict against the record
    assert reruns.rank_test(ppl, [NAN, 63.5, 65.5], higher_is_better=False) >= reruns.ALPHA


def test_reruns_inside_the_spread_pass_and_reruns_beyond_it_fail(capsys):
    committed = rows(COMMITTED)
    assert reruns.within_spread(committed, rows([81.0, 83.1, 82.5]), [10, 11, 12]) == 0
    assert "within the committed spread" in capsys.readouterr().out
    assert reruns.within_spread(committed, rows([70.0, 71.0, NAN]), [10, 11, 12]) == 1
    out = capsys.readouterr().out
    assert "OUTSIDE the committed spread" in out and "diverged 0 of 10 committed, 1 of 3 rerun" in out
    assert "the record does NOT reproduce" in out


def test_only_the_endpoint_is_tested_and_the_rest_shown(capsys):
    committed = pd.concat(
        [
            rows(COMMITTED, metric="ppl", method="none", pattern="dense", sparsity=0.0),
            rows(COMMITTED, metric="ppl", method="magnitude", sparsity=0.9),
        ]
    )
    rerun = pd.concat(
        [
            rows([82.0, 83.0, 81.0], metric="ppl", method="none", pattern="dense", sparsity=0.0),
            rows([200.0, 210.0, 220.0], metric="ppl", method="magnitude", sparsity=0.9),
        ]
    )
    assert reruns.within_spread(committed, rerun, [10, 11, 12]) == 0
    out = capsys.readouterr().out
    assert (
        "ppl magnitude unstructured 0.9: reruns 200, 210, 220; committed 79.5 to 85; diverged 0 of 10 committed, 0 of 3 rerun (shown, not tested)"
        in out
    )


def test_bit_for_bit_is_the_recorded_digits_and_a_divergence_matches_a_divergence(capsys):
    committed = pd.concat([rows([82.123456789012, NAN], mode=True)])
    same = rows([82.12345678901, NAN], mode=True)  # equal to the record's 10 significant digits
    assert reruns.exactly(committed, same.iloc[:1], [10]) == 0
    assert "1 of 1 numbers identical: the record reproduces bit for bit" in capsys.readouterr().out
    assert reruns.exactly(committed, rows([82.1234568], mode=True), [10]) == 1
    assert "DIFFERS" in capsys.readouterr().out
    assert reruns.exactly(committed.iloc[1:].assign(seed=10), rows([NAN], mode=True), [10]) == 0
    assert "committed diverged, rerun diverged: identical" in capsys.readouterr().out


def test_a_record_without_the_mode_recorded_is_not_in_it():
    assert reruns.in_reproducible_mode(rows([1.0], mode=True))
    assert not reruns.in_reproducible_mode(rows([1.0], mode=NAN))
    assert not reruns.in_reproducible_mode(rows([1.0, 2.0]).assign(reproducible_cpu=[True, False]))


def test_the_demo_judges_identical_numbers_and_shows_a_divergence_as_such(tmp_path, capsys):
    reference = tmp_path / "runs.csv"
    base = dict(
        pipeline="gpt2",
        data="pydoc",
        model="m",
        arm="horst",
        optimizer="horst",
        eval_split="test",
        git_commit="c",
        signature="s",
        wall_time_s=1.0,
        host="vm",
        cpu="AMD EPYC",
        cpu_capability="AVX2",
        cpu_threads=1,
        gpu=NAN,
    )
    committed = rows([NAN, 61.5], metric="ppl", method="none", pattern="dense", sparsity=0.0, mode=True).assign(**base)
    committed.to_csv(reference, index=False)
    assert reruns.compare_with_reference(committed, reference) == 0
    out = capsys.readouterr().out
    assert "| diverged | diverged | yes |" in out and "2 of 2 numbers identical, bit for bit" in out
    assert "reproducible mode" in out
    assert reruns.compare_with_reference(committed.assign(value=[NAN, 61.6]), reference) == 1
    native = committed.assign(reproducible_cpu=False)
    assert reruns.compare_with_reference(native, reference) == 1
    assert "the numbers are shown, not judged" in capsys.readouterr().out


def test_a_gpt2_whose_perplexity_pruning_does_not_move_is_collapsed():
    def run(name, dense, pruned):
        frame = pd.concat(
            [
                rows([dense], metric="ppl", method="none", pattern="dense", sparsity=0.0),
                *(rows([v], metric="ppl", method="magnitude", sparsity=s) for s, v in pruned.items()),
            ]
        )
        return frame.assign(run=name)

    frame = pd.concat(
        [
            run("gpt2/horst/seed0", 294.5, {0.5: 294.6, 0.9: 296.3}),  # within 1 %: nothing in its blocks
            run("gpt2/adamw/seed0", 61.5, {0.5: 62.0, 0.9: 187.1}),
            run("gpt2/ham/seed0", NAN, {0.5: NAN, 0.9: NAN}),  # diverged: shown as diverged, not collapsed
        ]
    )
    assert reruns.collapsed(frame) == {"gpt2/horst/seed0"}


def test_a_protocol_from_v7_on_accepts_only_runs_in_the_reproducible_mode():
    frame = pd.concat([rows([1.0], mode=True), rows([2.0], first_seed=11, mode=NAN), rows([3.0], first_seed=12)])
    assert check.unreproducible_runs(frame, 6) == []  # v1-v6 ran before the mode existed
    assert check.unreproducible_runs(frame, None) == []  # the demo: no protocol
    assert check.unreproducible_runs(frame, 7) == ["runs/seed11", "runs/seed12"]
    assert check.unreproducible_runs(frame.drop(columns="reproducible_cpu"), 7) == sorted(frame.run)


def test_a_diverged_run_without_a_row_for_a_number_counts_as_diverged_in_it(capsys):
    dense = rows(COMMITTED[:8] + [NAN, NAN], metric="ppl", method="none", pattern="dense", sparsity=0.0)
    wanda = rows(COMMITTED[:8], metric="ppl", method="wanda", sparsity=0.5)  # the diverged two have no wanda row
    rerun = pd.concat(
        [
            rows([80.0, 81.0, 82.0], metric="ppl", method="none", pattern="dense", sparsity=0.0),
            rows([80.0, 81.0, 82.0], metric="ppl", method="wanda", sparsity=0.5),
        ]
    )
    reruns.within_spread(pd.concat([dense, wanda]), rerun, [10, 11, 12])
    out = capsys.readouterr().out
    assert "ppl wanda unstructured 0.5: reruns 80, 81, 82; committed 79.5 to 84.1; diverged 2 of 10 committed" in out


def test_a_cell_not_run_yet_is_named_and_passed_over_and_a_record_of_another_config_fails(
    tmp_path, monkeypatch, capsys
):
    """`make check-results` between a version's registration and its runs: a pipeline whose cell the
    record does not hold at all is not checked (said so); nothing checked is a failure; a run the
    record holds at another config fails as before. No rerun is started in either case."""
    from horst_sparse.analysis.runs import RECORD_COLUMNS

    (tmp_path / "results" / "embedded").mkdir(parents=True)
    record = tmp_path / "results" / "embedded" / "runs.csv"
    pd.DataFrame(columns=RECORD_COLUMNS).to_csv(record, index=False)
    monkeypatch.setattr(check, "REPO", tmp_path)
    monkeypatch.setattr("horst_sparse.study.run.run_multiruns", lambda *a, **k: pytest.fail("a rerun started"))
    one_seed = ["seed=20"]  # the first reporting seed alone: the check composes 9 jobs, not 360
    assert check.check_results("embedded", extra=one_seed, pipelines=["vit"]) == 1
    out = capsys.readouterr().out
    assert "vit: outputs/embedded/v7/vit/horst/s0.9/seed20 is not in the record yet" in out
    assert "nothing was checked" in out
    run = "outputs/embedded/v7/vit/horst/s0.9/seed20"
    other = {c: None for c in RECORD_COLUMNS} | {"run": run, "pipeline": "vit", "seed": 20, "signature": "other",
                                                "metric": "top1", "value": 0.5}  # fmt: skip
    pd.DataFrame([other], columns=RECORD_COLUMNS).to_csv(record, index=False)
    assert check.check_results("embedded", extra=one_seed, pipelines=["vit"]) == 1
    assert "not in the record as a run of this job's config" in capsys.readouterr().out
