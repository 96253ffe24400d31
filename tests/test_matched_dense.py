"""Claim 2 at matched dense quality (horst_sparse.analysis.matched): AdamW's pruned perplexity at an
arm's dense perplexity, interpolated on the same seed's curve over training (log-log, piecewise
linear, no extrapolation), and the endpoint `matched: dense` that compares with it through the judge;
curve points in the record apart from the final numbers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, vit_claim
from PIL import Image

from horst_sparse.analysis import claims, matched, report, runs

RULES = claims.load_rules()
A, B = {0.5: 0.05, 0.9: 0.8}, {0.5: 1.0, 0.9: 1.2}  # AdamW's pruned ppl: exp(A + B log dense), exactly


def line(sparsity: float, dense: float) -> float:
    return math.exp(A[sparsity] + B[sparsity] * math.log(dense))


def study(gains: dict[float, float], *, seeds: int = 6, outside: tuple[int, ...] = (5,)) -> pd.DataFrame:
    """A GPT-2 record with curves: AdamW's dense perplexity 400, 200, 120 at steps 100-300 and 80 at the
    end, its pruned one on `line`; HORST's final dense perplexity 100 (60, below AdamW's reach, for the
    seeds `outside`), its pruned one `line` x exp(gain + a seed's noise), with a curve of its own."""
    rng = np.random.default_rng(0)
    rows = []

    def add(arm, seed, step, dense, pruned):
        common = dict(
            run=f"gpt2/{arm}/seed{seed}", pipeline="gpt2", data="pydoc", model="gpt2_tiny", arm=arm,
            optimizer=arm, seed=seed, eval_split="test", git_commit="c" * 40, signature=arm, wall_time_s=1.0,
            step=step,
        )  # fmt: skip
        metric = "ppl" if math.isnan(step) else "ppl_curve"
        rows.append({**common, "metric": metric, "method": "none", "pattern": "dense", "sparsity": 0.0, "value": dense})
        for s, value in pruned.items():
            rows.append({**common, "metric": metric, "method": "magnitude", "pattern": "unstructured", "sparsity": s, "value": value})  # fmt: skip

    for seed in range(seeds):
        wobble = 1 + 0.01 * seed
        for step, dense in ((100, 400), (200, 200), (300, 120), (math.nan, 80)):
            add("adamw", seed, step, dense * wobble, {s: line(s, dense * wobble) for s in A})
        noise = rng.normal(0, 0.01, len(A))
        final = 60.0 if seed in outside else 100.0
        for step, dense in ((100, 300), (200, 150), (math.nan, final)):
            add("horst", seed, step, dense, {s: line(s, dense) * math.exp(gains[s] + n) for s, n in zip(A, noise)})
    return pd.DataFrame(rows)


def matched_rules(**extra) -> dict:
    endpoint = {"metric": "ppl", "first": "horst", "second": "adamw", "at": [0.5, 0.9], "matched": "dense"}
    claim = {"id": "2m", "text": "HORST loses less to pruning at matched dense perplexity.", "pipeline": "gpt2"}
    return {**RULES, **extra, "claims": [{**claim, "endpoints": [endpoint]}]}


def test_interpolation_is_exact_on_a_log_log_line_and_nothing_outside_its_range():
    dense = [400.0, 120.0, 200.0, 80.0]  # not in dense order: training may not improve at every step
    pruned = [line(0.9, d) for d in dense]
    for at in (80.0, 95.0, 150.0, 399.0, 400.0):
        assert matched.interpolate(dense, pruned, at) == pytest.approx(line(0.9, at), rel=1e-12)
    assert math.isnan(matched.interpolate(dense, pruned, 79.0)) and math.isnan(matched.interpolate(dense, pruned, 401))
    # points of one dense perplexity: the mean of their logs; a point that is not finite is left out
    assert matched.interpolate([100.0, 100.0, 200.0], [10.0, 40.0, 80.0], 100.0) == pytest.approx(20.0)
    # between (100, 10) and (300, 30): slope 1 on the log-log line, so 20 at 200
    assert matched.interpolate([100.0, 200.0, 300.0], [10.0, math.inf, 30.0], 200.0) == pytest.approx(20.0)


def test_a_seed_outside_adamws_curve_is_not_compared_and_is_listed():
    frame = study({0.5: -0.1, 0.9: -0.3}, outside=(2, 5))
    m = matched.matched_gains(frame, "gpt2", "horst", "adamw", 0.9)
    assert sorted(m.gains.index) == [0, 1, 3, 4] and m.seeds == 6
    assert m.gains.mean() == pytest.approx(-0.3, abs=0.02)
    assert sorted(m.outside) == [2, 5] and m.outside[5] == (60.0, pytest.approx(80 * 1.05), pytest.approx(400 * 1.05))
    words = m.words("horst", "adamw")
    assert words.startswith("2 of 6 horst seeds not comparable") and "seed 5 at 60, the curve 84-420" in words


def test_the_matched_endpoint_through_the_judge():
    """The log ratio at AdamW's interpolated perplexity, its not-comparable seed out of the pairs and
    named; under `divergence: worst` a diverged HORST run counts as its worst outcome."""
    frame = study({0.5: -0.1, 0.9: -0.3})
    judged = claims.judge(frame, matched_rules()).set_index("endpoint")
    row = judged.loc["horst / adamw at 90 %, matched dense perplexity"]
    assert row.n == 5 and row.estimate == pytest.approx(-0.3, abs=0.02) and row.outcome == claims.SUPPORTS
    assert row.not_comparable.startswith("1 of 6 horst seeds not comparable")
    assert judged.loc["horst / adamw at 50 %, matched dense perplexity", "estimate"] == pytest.approx(-0.1, abs=0.02)
    # The plain ratio reads the final numbers alone: HORST's less trained models lose less
    plain = {**matched_rules(), "claims": [{**matched_rules()["claims"][0], "endpoints": [
        {"metric": "ppl", "first": "horst", "second": "adamw", "at": [0.9]}]}]}  # fmt: skip
    ratio = claims.judge(frame, plain).iloc[0]
    assert ratio.n == 6 and "not_comparable" not in ratio
    final = matched.final_numbers(frame).drop(columns="step")
    assert ratio.estimate == claims.judge(final, plain).iloc[0].estimate

    lost = frame.copy()
    lost.loc[(lost.arm == "horst") & (lost.seed == 0) & lost.step.isna(), "value"] = np.nan  # diverged
    lost = lost[~((lost.arm == "horst") & (lost.seed == 0) & lost.step.notna())]  # a diverged run has no curve
    counted = claims.judge(lost, matched_rules(divergence="worst")).set_index("endpoint")
    row = counted.loc["horst / adamw at 90 %, matched dense perplexity"]
    assert row.n == 5 and row.low == -math.inf and row.n_complete == 4  # seed 0 counted, seed 5 still out


def test_a_matched_endpoint_is_only_of_an_at_endpoint_of_a_ratio():
    rules = matched_rules()
    rules["claims"][0]["endpoints"][0] = {**rules["claims"][0]["endpoints"][0], "matched": "steps"}
    with pytest.raises(ValueError, match="`matched: dense` is the only matching"):
        claims.judge(study({0.5: 0.0, 0.9: 0.0}), rules)


def test_the_record_keeps_curve_points_and_a_record_without_them_has_no_step(tmp_path):
    frame = study({0.5: -0.1, 0.9: -0.3})
    runs.write_record(frame, tmp_path / "runs.csv")
    header = (tmp_path / "runs.csv").read_text().splitlines()[0].split(",")
    assert header[header.index("sparsity") + 1] == "step"
    again = runs.read_record([tmp_path / "runs.csv"])
    assert len(again) == len(frame) and sorted(matched.curve_points(again).step.unique()) == [100, 200, 300]
    final = matched.final_numbers(frame).drop(columns="step")
    runs.write_record(final, tmp_path / "final.csv")
    assert "step" not in (tmp_path / "final.csv").read_text().splitlines()[0].split(",")
    # Two runs of one setting and seed count once, their curve points each at its own step
    kept, _ = runs.results(frame)
    assert len(kept) == len(frame)


def test_the_report_draws_the_curves_where_the_rules_ask(tmp_path):
    frame = study({0.5: -0.1, 0.9: -0.3})
    text = report.write_report(frame, tmp_path, rules=matched_rules(), split="test")
    assert "matched dense perplexity" in text and "1 of 6 horst seeds not comparable" in text
    with Image.open(tmp_path / "pruned_vs_dense.png") as image:
        assert image.width > 1000 and image.height > 500
    assert "ppl_curve" not in (tmp_path / "tables.md").read_text()  # the tables hold the final numbers
    report.write_report(matched.final_numbers(frame).drop(columns="step"), tmp_path, rules=RULES, split="test")
    assert not (tmp_path / "pruned_vs_dense.png").exists()  # rules without the endpoint: no figure


def test_an_endpoint_with_every_seed_outside_the_curve_says_so_wherever_it_is_reported(tmp_path):
    """HORST's every final model denser-better than AdamW ever got: its matched endpoints are not
    testable, and claims.md, the headline and the plain reading say why, not "no runs of both"."""
    rules = matched_rules()
    rules["claims"][0]["endpoints"].append({"metric": "ppl", "first": "horst", "second": "adamw", "at": [0.9]})
    text = report.write_report(
        study({0.5: -0.1, 0.9: -0.3}, outside=tuple(range(6))), tmp_path, rules=rules, split="test"
    )
    assert "- horst / adamw at 90 %, matched dense perplexity: 6 of 6 horst seeds not comparable" in text
    assert "no runs of both" not in text
    why = "2 endpoints not testable (6 of 6 horst seeds not comparable, their dense perplexity outside adamw's curve)"
    assert f"horst / adamw: {why}" in (tmp_path / "headline.md").read_text()
    assert why in (tmp_path / "plain.md").read_text()


def test_protocol_v7s_rules_judge_claim_2_at_matched_dense_quality_counting_divergence():
    """protocols/embedded/claims_v7.yaml: claim 2's primary endpoints are matched, tested by the
    signed-rank test with divergence counted; claim 1's change endpoint is fixed at 90 %."""
    rules = claims.load_rules(ROOT / "protocols" / "embedded" / "claims_v7.yaml")
    assert rules["divergence"] == "worst" and rules["smallest_effect"] == {"top1": 1.0, "ppl": 1.05}
    judgement = claims.judge(study({0.5: -0.1, 0.9: -0.2}, seeds=10, outside=(9,)), rules).set_index("endpoint")
    at_50 = judgement.loc["horst / adamw at 50 %, matched dense perplexity"]
    assert at_50.test == "signed-rank" and at_50.n == 9 and at_50.outcome == claims.SUPPORTS
    assert "horst − adamw: gain at 90 % minus gain at 70 %" in judgement.index
    assert ["horst", "adamw"] in rules["comparisons"]["gpt2"]  # the plain ratio: shown, not judged


def test_v7s_report_draws_one_figure_with_adamw_as_the_reference_and_ham_as_a_curve(tmp_path):
    """claims_v7.yaml's matched endpoints compare with AdamW and with HAM: the report judges both and
    draws one figure, every seed's curve of AdamW (the first reference) and HAM's mean curve."""
    rules = claims.load_rules(ROOT / "protocols" / "embedded" / "claims_v7.yaml")
    frame = study({0.5: -0.1, 0.9: -0.2}, seeds=6, outside=())
    ham = frame[frame.arm == "adamw"].assign(arm="ham", optimizer="ham", signature="ham")
    ham = ham.assign(run=ham.run.str.replace("adamw", "ham"), value=ham.value * 1.01)
    assert report.matched_figure_of(rules)[1:3] == ("adamw", ["adamw", "horst", "ham", "horst_prunable"])
    text = report.write_report(pd.concat([frame, ham], ignore_index=True), tmp_path, rules=rules, split="test")
    assert "horst / adamw at 50 %, matched dense perplexity" in text and "horst / ham at 50 %, matched dense" in text
    assert (tmp_path / "pruned_vs_dense.png").is_file()


def test_v7s_report_of_the_vit_runs_alone_judges_them_and_draws_no_matched_figure(tmp_path, capsys):
    """v7's ViT runs land before its GPT-2 runs: the report judges claim 1, leaves the GPT-2 claims
    untested and says why the figure at matched dense perplexity is missing."""
    rules = claims.load_rules(ROOT / "protocols" / "embedded" / "claims_v7.yaml")
    text = report.write_report(vit_claim({0.7: 1.0, 0.8: 2.0, 0.9: 3.0}), tmp_path, rules=rules, split="test")
    assert "1. **" in text and "2. **not tested" in text
    headline = (tmp_path / "headline.md").read_text()
    assert "divergence: vit horst 0 of 10 [0-31 %]; vit adamw 0 of 10 [0-31 %]\n" in headline  # no GPT-2 arm
    assert not (tmp_path / "pruned_vs_dense.png").exists()
    assert "no gpt2 runs yet: no figure at matched dense perplexity" in capsys.readouterr().out


@pytest.mark.parametrize(
    "metric,ratio,sign,low,high,words",
    [
        ("top1", False, 1, -0.4, 0.8, "excludes a gain of 1 top-1 point or more and a loss of 1 top-1 point or more"),
        ("top1", False, 1, -2.0, 0.8, "excludes a gain of 1 top-1 point or more"),
        ("top1", False, 1, -2.0, 3.0, ""),  # too wide to rule out the effect that matters either way
        ("ppl", True, -1, math.log(0.97), math.log(1.2), "excludes a gain of ×1.05 or more"),
        ("ppl", True, -1, math.log(0.9), math.log(1.02), "excludes a loss of ×1.05 or more"),
    ],
)
def test_an_undecided_endpoint_says_which_effects_its_interval_excludes(metric, ratio, sign, low, high, words):
    """v7's rules state the smallest effect that matters; an undecided endpoint's interval is read
    against it in the claimed direction (for perplexity, lower is the gain)."""
    from types import SimpleNamespace

    rules = claims.load_rules(ROOT / "protocols" / "embedded" / "claims_v7.yaml")
    unit = "top-1 points" if metric == "top1" else "ppl ratio"
    row = SimpleNamespace(metric=metric, ratio=ratio, sign=sign, low=low, high=high, n=10, unit=unit, margin=None,
                          outcome=claims.UNDECIDED)  # fmt: skip
    assert report.excluded(row, rules) == words
    assert report.excluded(SimpleNamespace(**{**row.__dict__, "outcome": claims.SUPPORTS}), rules) == ""
    assert report.excluded(row, claims.load_rules()) == ""  # v3-v6's rules state no effect
