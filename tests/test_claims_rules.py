"""The rules of protocol v3 in horst_sparse/analysis: the sign-flip permutation test as the stated
sensitivity analysis of every endpoint, margins (pre-stated effect sizes) and an endpoint's own
scale, claim 3's margins in claims.yaml, and the figures showing every seed with their intervals."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT, record, vit_claim

from horst_sparse.analysis import claims, figures
from horst_sparse.analysis.stats import holm, paired_interval, sign_flip_p

RULES = claims.load_rules()
CLAIM_3 = "3"


def brute_force_p(differences: list[Fraction]) -> float:
    """Every sign pattern, in exact arithmetic: the share whose |sum| reaches the observed one."""
    observed = abs(sum(differences))
    patterns = list(itertools.product((1, -1), repeat=len(differences)))
    return sum(abs(sum(s * d for s, d in zip(signs, differences))) >= observed for signs in patterns) / len(patterns)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 11])
def test_sign_flip_p_is_the_share_of_sign_patterns_at_least_as_extreme(n):
    """Tenths in exact arithmetic: many patterns tie with the observed one, and a float sum in
    another order must still count as a tie."""
    rng = np.random.default_rng(n)
    tenths = [Fraction(int(k), 10) for k in rng.integers(-9, 15, n)]
    assert sign_flip_p([float(t) for t in tenths]) == pytest.approx(brute_force_p(tenths), abs=1e-12)


def test_sign_flip_p_of_no_difference_is_one_and_of_none_nan():
    assert sign_flip_p([0.0] * 6) == 1.0
    assert math.isnan(sign_flip_p([]))


def test_sign_flip_p_of_ten_pairs_of_one_sign_is_the_smallest_possible():
    assert sign_flip_p(np.linspace(0.1, 1.0, 10)) == 2 / 1024
    assert sign_flip_p(-np.linspace(0.1, 1.0, 10)) == 2 / 1024


def test_sign_flip_p_beyond_16_pairs_is_a_fixed_monte_carlo_of_the_exact_p():
    d = np.random.default_rng(3).normal(0.4, 1.0, 17)
    signs = 1 - 2 * ((np.arange(2**17)[:, None] >> np.arange(17)) & 1)
    exact = float(np.mean(np.abs(signs @ d) >= abs(d.sum()) * (1 - 1e-12)))
    p = sign_flip_p(d)
    assert p == sign_flip_p(d)  # the same draws every time
    assert p == pytest.approx(exact, abs=4 * math.sqrt(exact * (1 - exact) / 2**16))
    assert 1 / (2**16 + 1) <= sign_flip_p(np.ones(40)) < 3 / (2**16 + 1)  # the observed pattern counts: never 0


def test_the_judgement_carries_the_sign_flip_test_beside_the_t_test():
    frame = vit_claim({0.7: 0.5, 0.8: 1.5, 0.9: 2.0})
    judgement = claims.judge(frame, RULES)
    one = judgement[judgement.claim == "1"]
    table = claims.per_seed(frame, "vit", "top1", "acdc", "unstructured")
    gains = claims.paired_gains(table, "horst", "adamw", 0.9, log=False)
    row = one.set_index("endpoint").loc["horst − adamw at 90 %"]
    assert row.p_signflip == sign_flip_p(gains.to_numpy()) == 2 / 1024
    assert one["p_signflip_holm"].tolist() == pytest.approx(holm(one["p_signflip"].tolist()))
    assert (one["outcome_signflip"] == one["outcome"]).all() and claims.sensitivity(judgement).empty
    assert judgement.loc[judgement.claim != CLAIM_3, "margin"].isna().all()  # only claim 3 states margins


def test_sensitivity_names_the_endpoints_whose_outcome_the_sign_flip_test_changes():
    """Five seeds: the t-test finds a clear gain, the sign-flip test cannot go below p = 0.0625."""
    judgement = claims.judge(vit_claim({0.7: 0.5, 0.8: 1.5, 0.9: 2.0}, seeds=5), RULES)
    differ = claims.sensitivity(judgement)
    assert set(differ["endpoint"]) >= {"horst − adamw at 70 %", "horst − adamw at 90 %"}
    assert set(differ["outcome"]) == {claims.SUPPORTS} and set(differ["outcome_signflip"]) == {claims.UNDECIDED}
    assert (differ["p_signflip_holm"] >= 0.0625).all()
    stated = claims.verdicts(judgement, RULES).set_index("claim")["verdict"]
    sensitive = claims.verdicts(judgement, RULES, outcome="outcome_signflip").set_index("claim")["verdict"]
    assert (stated["1"], sensitive["1"]) == (claims.REPRODUCED, claims.INCONCLUSIVE)


def weights(share_ratio: float, median_shift: float, seeds: int = 10, noise: float = 0.02) -> pd.DataFrame:
    """Claim 3's numbers of a GPT-2 study: HORST's share below 1e-3 `share_ratio` times AdamW's,
    its median log10|w| `median_shift` decades off AdamW's, per seed."""
    rng = np.random.default_rng(7)
    share, median = rng.uniform(2, 4, seeds), rng.normal(-1.8, 0.1, seeds)
    return record(
        {
            ("adamw", "weights_below_1e-3", 0.0): list(share),
            ("horst", "weights_below_1e-3", 0.0): list(share * share_ratio * np.exp(rng.normal(0, noise, seeds))),
            ("adamw", "weights_median_log10", 0.0): list(median),
            ("horst", "weights_median_log10", 0.0): list(median + median_shift + rng.normal(0, noise, seeds)),
        },
        pipeline="gpt2",
    )


SHARE = "% of weights with |w| < 1e-3: horst / adamw at dense, at least ×2"
MEDIAN = "median log10|w|: horst − adamw at dense, at most -0.301"


@pytest.mark.parametrize(
    ("share_ratio", "median_shift", "outcomes", "verdict"),
    [
        (3.0, -0.5, (claims.SUPPORTS, claims.SUPPORTS), claims.REPRODUCED),
        (1.5, -0.1, (claims.CONTRADICTS, claims.CONTRADICTS), claims.NOT_REPRODUCED),  # the right way, too little
        (2.0, -0.301, (claims.UNDECIDED, claims.UNDECIDED), claims.INCONCLUSIVE),  # on the margin
    ],
)
def test_claim_3_is_judged_against_its_margins(share_ratio, median_shift, outcomes, verdict):
    judgement = claims.judge(weights(share_ratio, median_shift), RULES)
    three = judgement[judgement.claim == CLAIM_3].set_index("endpoint")
    assert (three.loc[SHARE, "outcome"], three.loc[MEDIAN, "outcome"]) == outcomes
    assert tuple(three.loc[[SHARE, MEDIAN], "outcome_signflip"]) == outcomes
    assert claims.verdicts(judgement, RULES).set_index("claim").loc[CLAIM_3, "verdict"] == verdict
    # the estimate is the gain itself, not the gain beyond the margin
    assert math.exp(three.loc[SHARE, "estimate"]) == pytest.approx(share_ratio, rel=0.03)
    assert three.loc[MEDIAN, "estimate"] == pytest.approx(median_shift, abs=0.03)
    assert (three.loc[SHARE, "margin"], three.loc[MEDIAN, "margin"]) == (2.0, -0.301)
    assert three.loc[SHARE, "ratio"] and three.loc[SHARE, "unit"] == "share ratio"


def test_a_margin_moves_the_test_not_the_estimate_interval_or_power():
    frame = weights(3.0, -0.5)
    without = yaml.safe_load(yaml.safe_dump(RULES))
    for spec in next(c for c in without["claims"] if c["id"] == CLAIM_3)["endpoints"]:
        del spec["margin"]
    shifted, plain = (claims.judge(frame, r).query("claim == @CLAIM_3").reset_index() for r in (RULES, without))
    for column in ("estimate", "low", "high", "n", "detectable"):
        assert shifted[column].tolist() == pytest.approx(plain[column].tolist()), column
    gains = plain.loc[1, "estimate"]  # median: the test reads the gains minus the margin
    assert shifted.loc[1, "p"] > plain.loc[1, "p"] and gains < -0.301
    table = claims.per_seed(frame, "gpt2", "weights_median_log10", "none", "dense")
    per_seed = claims.paired_gains(table, "horst", "adamw", 0.0, log=False).to_numpy()
    assert shifted.loc[1, "p"] == pytest.approx(paired_interval(per_seed + 0.301, 0.95).p)
    assert shifted.loc[1, "p_signflip"] == sign_flip_p(per_seed + 0.301)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"margin": 0.5}, "margin 0.5 lies against the claimed direction"),  # "at least half" is no gain
        ({"margin": -2.0}, "margin -2 lies against"),  # a ratio's margin is positive
        ({"unit": None}, "on the ratio scale states its unit"),  # points are no unit of a ratio
    ],
)
def test_a_misstated_endpoint_is_an_error_not_a_verdict(change, error):
    rules = yaml.safe_load(yaml.safe_dump(RULES))
    share = next(c for c in rules["claims"] if c["id"] == CLAIM_3)["endpoints"][0]
    share.update(change)
    if share["unit"] is None:
        del share["unit"]
    with pytest.raises(ValueError, match=error):
        claims.judge(weights(3.0, -0.5), rules)


def test_claims_yaml_states_claim_3_margins_and_keeps_every_other_rule_of_protocol_v2():
    """The rules of protocols v3 on differ from v2's frozen copy in claim 3's endpoints only: its
    text is the paper's, its margins read from the words."""
    v2 = yaml.safe_load((ROOT / "protocols" / "embedded" / "claims_v2.yaml").read_text())
    three, old = (next(c for c in r["claims"] if c["id"] == CLAIM_3) for r in (RULES, v2))
    assert three["text"] == old["text"] and three["pipeline"] == old["pipeline"]
    assert [(e["metric"], e.get("scale"), e["margin"]) for e in three["endpoints"]] == [
        ("weights_below_1e-3", "ratio", 2.0),
        ("weights_median_log10", None, -0.301),
    ]
    # every other claim tests what v2's tests (2b's text says its arm is tuned on its own)
    assert [(c["id"], c["endpoints"]) for c in RULES["claims"] if c["id"] != CLAIM_3] == [
        (c["id"], c["endpoints"]) for c in v2["claims"] if c["id"] != CLAIM_3
    ]
    same = ("claims", "comparisons")
    assert {k: v for k, v in RULES.items() if k not in same} == {k: v for k, v in v2.items() if k not in same}
    for pipeline, pairs in v2["comparisons"].items():  # v3 adds GPT-2's mirror-off control
        assert pairs == RULES["comparisons"][pipeline][: len(pairs)]
    header = (ROOT / "horst_sparse" / "analysis" / "claims.yaml").read_text().split("confidence:")[0]
    assert "Sensitivity analysis, stated here and deciding no verdict" in header


@pytest.fixture
def drawn(monkeypatch):
    """The figures a call draws, kept open (savefig writes nothing)."""
    from matplotlib.figure import Figure

    seen: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: seen.append(self))
    return seen


def test_the_metric_figure_bars_each_mean_with_its_t_interval(tmp_path, drawn):
    frame = vit_claim({0.7: 0.5, 0.8: 1.5, 0.9: 2.0})
    figures.metric_figure(frame, tmp_path / "a.png", metric="top1", ylabel="top-1", title="t")
    (ax,) = drawn[0].axes
    assert "95\u00a0% t-interval over 10 seeds" in drawn[0].get_suptitle()
    bars = {c.get_label().split()[0]: c for c in ax.containers}
    assert set(bars) == {"adamw", "horst"}
    segments = bars["horst"].lines[2][0].get_segments()  # one vertical segment per sparsity, in its order
    at_90 = frame[(frame.arm == "horst") & (frame.sparsity == 0.9)]["value"].to_numpy()
    interval = paired_interval(at_90, 0.95)
    assert (segments[-1][0][1], segments[-1][1][1]) == pytest.approx((interval.low, interval.high))


def test_the_metric_figure_draws_one_line_per_setting_of_a_swept_arm(tmp_path, drawn):
    """An arm run at two alphas is two lines, named by the key that differs, not one pooled mean."""
    frame = vit_claim({0.7: 0.5, 0.9: 2.0})
    swept = frame[frame.arm == "horst"].assign(signature="horst-a10", value=lambda f: f.value - 5)
    frame = pd.concat([frame, swept], ignore_index=True)
    frame["config.optimizer.alpha"] = np.where(frame.signature == "horst-a10", 10.0, 3.0)
    figures.metric_figure(frame, tmp_path / "a.png", metric="top1", ylabel="top-1", title="t")
    lines = {c.get_label().split(" (")[0]: c for c in drawn[0].axes[0].containers}
    assert set(lines) == {"adamw", "horst, optimizer.alpha=3", "horst, optimizer.alpha=10"}
    means = {name: line.lines[0].get_ydata() for name, line in lines.items()}
    assert means["horst, optimizer.alpha=10"] == pytest.approx(means["horst, optimizer.alpha=3"] - 5)


def test_the_metric_figure_of_one_seed_says_so_and_draws_no_bar(tmp_path, drawn):
    frame = vit_claim({0.7: 0.5, 0.9: 2.0}, seeds=1)
    figures.metric_figure(frame, tmp_path / "a.png", metric="top1", ylabel="top-1", title="t")
    assert "one seed per cell: its value, no interval" in drawn[0].get_suptitle()
    assert not drawn[0].axes[0].containers


def test_the_metric_figure_counts_the_seeds_its_mean_is_of_and_names_the_diverged(tmp_path, drawn):
    frame = vit_claim({0.7: 0.5, 0.9: 2.0})
    frame.loc[(frame.arm == "horst") & frame.seed.isin([2, 5]), "value"] = np.nan
    figures.metric_figure(frame, tmp_path / "a.png", metric="top1", ylabel="top-1", title="t")
    labels = sorted(c.get_label() for c in drawn[0].axes[0].containers)
    assert labels == ["adamw (mean of 10 seeds)", "horst (mean of 8 seeds, 2 diverged)"]


def histogram_folders(tmp_path, frame: pd.DataFrame) -> dict:
    """A weight_histogram.json per run, each over its own range (as every run writes it)."""
    folders = {}
    for k, run in enumerate(frame.run.unique()):
        folder = tmp_path / run
        folder.mkdir(parents=True)
        edges = np.linspace(-5 - 0.1 * k, 0 + 0.05 * k, 11)
        (folder / "weight_histogram.json").write_text(
            json.dumps({"counts": [1, 2, 4, 8, 9, 7, 5, 3, 1, 1], "edges": edges.tolist()})
        )
        folders[run] = folder
    return folders


def test_the_weight_figure_draws_every_seed_as_mean_and_range(tmp_path, drawn):
    frame = weights(3.0, -0.5, seeds=3)
    _, used = figures.weight_figure(frame, histogram_folders(tmp_path, frame), tmp_path / "w.png")
    assert set(used) == set(frame.run)
    assert "3 seeds: mean and range" in drawn[0].get_suptitle()
    (ax,) = drawn[0].axes
    lines = [p for p in ax.patches if not p.get_fill()]
    assert sorted(p.get_label() for p in lines) == ["adamw (3 seeds)", "horst (3 seeds)"]
    for line in lines:  # the seeds' mean density on one grid: still a density
        values, edges, _ = line.get_data()
        assert float(np.sum(values * np.diff(edges))) == pytest.approx(1.0)
    assert len([p for p in ax.patches if p.get_fill()]) == 2  # a band per arm


def test_the_weight_figure_of_one_saved_seed_says_seed_0_only(tmp_path, drawn):
    """A study resumed from its record: the saved histograms are seed 0's; the other seeds are named."""
    frame = weights(3.0, -0.5, seeds=3)
    _, used = figures.weight_figure(frame, histogram_folders(tmp_path, frame), tmp_path / "w.png")
    saved = {run: h for run, h in used.items() if run.endswith("seed0")}
    notes, again = figures.weight_figure(frame, {}, tmp_path / "w.png", saved)
    assert set(again) == set(saved)
    assert drawn[-1].get_suptitle().endswith("seed 0 only")
    assert any("for seed 1, 2" in n and "not in the weight figure" in n for n in notes)


def test_seeds_that_fall_out_of_the_pairs_are_named_with_why():
    """Two HORST runs diverged (their numbers NaN, as the record keeps them) and one has no
    weight statistics: the pairs lose those seeds, and the claims and the headline say whose
    and why instead of showing a smaller n alone."""
    from horst_sparse.analysis import report

    frame = weights(3.0, -0.5)
    diverged = (frame.arm == "horst") & frame.seed.isin([3, 7])
    frame.loc[diverged, "value"] = np.nan
    frame = frame[~((frame.arm == "horst") & (frame.seed == 5) & (frame.metric == "weights_median_log10"))]
    judgement = claims.judge(frame, RULES).set_index("endpoint")
    assert judgement.loc[SHARE, "n"] == 8 and judgement.loc[SHARE, "unpaired"] == "horst: 2 of 10 seeds diverged"
    assert judgement.loc[MEDIAN, "n"] == 7 and judgement.loc[MEDIAN, "unpaired"] == (
        "horst: 2 of 10 seeds diverged; horst: 1 of 10 seeds without this number"
    )
    judgement = judgement.reset_index()
    text = report.claims_markdown(judgement, claims.verdicts(judgement, RULES), RULES, "test")
    assert "n=8 (horst: 2 of 10 seeds diverged, not in the pairs), Holm p" in text
    headline = report.headline_markdown(judgement, claims.verdicts(judgement, RULES), "test", "runs.csv", RULES)
    (line,) = [line for line in headline.splitlines() if line.startswith("- Claim 3")]
    assert "(left out of the pairs: horst: 2 of 10 seeds diverged; horst: 1 of 10 seeds without this number): " in line
    assert line.count("2 of 10 seeds diverged") == 1  # once per claim, not once per endpoint
    assert "(left out of the pairs:" not in claims_line(headline, "1")


def claims_line(headline: str, claim: str) -> str:
    return next((line for line in headline.splitlines() if line.startswith(f"- Claim {claim}:")), "")
