"""Divergence counted as an outcome (the rule `divergence: worst`): the exact signed-rank test over
every seed both arms ran, a diverged run ranked as its arm's worst outcome, the median gain with its
order-statistic interval, each arm's divergence rate with its exact interval, and the complete-case
t-test beside it as the sensitivity analysis. Rules without the key judge as before."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from conftest import record, vit_claim
from scipy import stats

from horst_sparse.analysis import claims, report, tables
from horst_sparse.analysis.stats import median_interval, rate_interval, signed_rank_p

RULES = claims.load_rules()
COUNTING = {**RULES, "divergence": "worst"}
AT_90 = "horst − adamw at 90 %"


@pytest.mark.parametrize("n", [3, 6, 10])
def test_signed_rank_p_is_wilcoxons_exact_test(n):
    d = np.random.default_rng(n).normal(0.5, 1.0, n)
    assert signed_rank_p(d) == pytest.approx(stats.wilcoxon(d, method="exact").pvalue, abs=1e-12)


def test_a_diverged_run_takes_the_highest_rank_and_no_more():
    """An infinite difference counts as the largest, as a very large finite one would."""
    d = [0.3, -0.2, 0.5, 0.1, -0.4, 0.7, 0.2, 0.6]
    assert signed_rank_p([*d, -math.inf]) == signed_rank_p([*d, -1e9])
    assert math.isnan(signed_rank_p([0.0, 0.0]))  # only ties: nothing to test


def test_the_median_interval_covers_as_stated():
    """[x_(k), x_(n+1-k)] with the exact binomial coverage >= 95 %: k = 2 for 10 values, none for 5."""
    x = np.arange(10.0)
    assert median_interval(x, 0.95) == (4.5, 1.0, 8.0)
    assert 1 - 2 * stats.binom.cdf(1, 10, 0.5) >= 0.95 > 1 - 2 * stats.binom.cdf(2, 10, 0.5)
    assert median_interval(np.arange(5.0), 0.95) == (2.0, -math.inf, math.inf)
    assert median_interval([*range(8), math.inf, math.inf], 0.95)[2] == math.inf  # reaches the diverged runs
    rng = np.random.default_rng(0)
    covered = [low <= 0 <= high for low, high in (median_interval(rng.normal(0, 1, 10), 0.95)[1:] for _ in range(4000))]
    assert np.mean(covered) == pytest.approx(1 - 2 * stats.binom.cdf(1, 10, 0.5), abs=0.01)


def test_the_divergence_rate_interval_is_clopper_pearsons():
    low, high = rate_interval(2, 10, 0.95)
    assert (low, high) == (pytest.approx(stats.beta.ppf(0.025, 2, 9)), pytest.approx(stats.beta.ppf(0.975, 3, 8)))
    assert rate_interval(0, 10, 0.95)[0] == 0.0


def diverged(frame, arm, seeds):
    """Runs of `arm` at `seeds` that diverged: every number NaN, as the record keeps them."""
    frame = frame.copy()
    frame.loc[(frame.arm == arm) & frame.seed.isin(seeds), "value"] = np.nan
    return frame


def test_horst_that_diverges_in_three_seeds_is_not_shown_better_by_dropping_them():
    """HORST beats AdamW by 2 points in every seed it finishes and diverges in 3 of 10: complete cases
    support the claim at 90 %; counted as HORST's worst outcome, the 3 seeds are 3 losses and the
    endpoint is undecided. Rules without the key judge as before (complete cases)."""
    frame = diverged(vit_claim({0.7: 2.0, 0.8: 2.0, 0.9: 2.0}), "horst", [2, 5, 8])
    before = claims.judge(frame, RULES).set_index("endpoint")
    assert before.loc[AT_90, "n"] == 7 and before.loc[AT_90, "outcome"] == claims.SUPPORTS
    assert "test" not in before and "n_complete" not in before
    after = claims.judge(frame, COUNTING).set_index("endpoint")
    row = after.loc[AT_90]
    assert row.n == 10 and row.test == "signed-rank" and row.outcome == claims.UNDECIDED
    assert row.p == pytest.approx(signed_rank_p([*([2.0] * 7), *([-math.inf] * 3)]), abs=0.05)
    assert row.low == -math.inf and row.estimate == pytest.approx(2.0, abs=0.3)  # the median of 7 wins, 3 losses
    assert (row.n_complete, row.outcome_complete) == (7, claims.SUPPORTS)
    verdict = claims.verdicts(after.reset_index(), COUNTING).set_index("claim").loc["1", "verdict"]
    assert verdict == claims.INCONCLUSIVE


def test_adamw_that_diverges_counts_as_horsts_win_and_both_diverged_tie():
    frame = diverged(vit_claim({0.7: 0.0, 0.8: 0.0, 0.9: 0.0}, noise=0.01), "adamw", range(10))
    frame = diverged(frame, "horst", [9])
    row = claims.judge(frame, COUNTING).set_index("endpoint").loc[AT_90]
    assert row.n == 10 and row.estimate == math.inf  # AdamW diverged in every seed, HORST in seed 9: a tie
    assert row.p == signed_rank_p([math.inf] * 9 + [0.0]) == 2 / 2**9 and row.outcome == claims.SUPPORTS


def test_a_missing_number_that_is_no_divergence_stays_out():
    frame = vit_claim({0.7: 1.0, 0.8: 1.0, 0.9: 1.0})
    frame = frame[~((frame.arm == "horst") & (frame.seed == 4) & (frame.sparsity == 0.9))]
    assert claims.judge(frame, COUNTING).set_index("endpoint").loc[AT_90, "n"] == 9


def test_the_report_gives_the_divergence_rates_and_the_complete_case_sensitivity():
    values = {
        (arm, "ppl", s): [30.0 + 5 * s + (1.0 if arm == "horst" else 0.0) + 0.1 * k for k in range(10)]
        for arm, s in itertools.product(("adamw", "ham", "horst", "horst_prunable"), (0.0, 0.5, 0.6, 0.7, 0.8, 0.9))
    }
    frame = diverged(record(values, pipeline="gpt2"), "horst", [3, 7])
    judgement = claims.judge(frame, COUNTING)
    verdicts = claims.verdicts(judgement, COUNTING)
    rates = claims.divergence_rates(frame, COUNTING).set_index(["pipeline", "arm"])
    assert (rates.loc[("gpt2", "horst"), "diverged"], rates.loc[("gpt2", "adamw"), "diverged"]) == (2, 0)
    text = report.claims_markdown(judgement, verdicts, COUNTING, "test", claims.divergence_rates(frame, COUNTING))
    assert "| gpt2 | horst | 2 of 10 | 20 % [3, 56] |" in text
    assert "### Sensitivity analysis: complete cases" in text and "exact signed-rank tests" in text
    headline = report.headline_markdown(
        judgement, verdicts, "test", "runs.csv", COUNTING, claims.divergence_rates(frame, COUNTING)
    )
    assert "gpt2 horst 2 of 10 [3-56 %]" in headline and "left out of the pairs" not in headline
    assert "[1.0" in text and "∞]" in text  # the rank interval reaches the diverged runs


def test_the_plain_reading_says_where_each_endpoint_falls_what_it_excludes_and_the_divergence():
    """The README's plain reading (report.plain_markdown): the verdict, each endpoint under its
    outcome with the judge's numbers, what an undecided interval excludes at the stated smallest
    effect, each arm's divergence, and the complete-case verdict where it differs."""
    rules = {**COUNTING, "smallest_effect": {"top1": 1.0}}
    frame = diverged(vit_claim({0.7: 3.0, 0.8: 0.0, 0.9: 0.05}, seeds=12), "horst", [2])
    judgement = claims.judge(frame, rules)
    verdicts = claims.verdicts(judgement, rules)
    line = report.plain_markdown(judgement, verdicts, rules, claims.divergence_rates(frame, rules)).splitlines()[0]
    at_90 = judgement.set_index("endpoint").loc[AT_90]
    assert at_90.outcome == claims.UNDECIDED and at_90.high < 1.0 and -at_90.low < 1.0
    assert line.startswith(
        "* **Claim 1 (vit): not reproduced.** top-1, horst − adamw in top-1 points (median over seeds [95 % interval]): "
    )
    assert "against the claim gain at 80 % minus gain at 70 % (" in line
    both = "excludes a gain of 1 top-1 point or more and a loss of 1 top-1 point or more"
    assert f"at 90 % ({tables.estimate_text(at_90)}; {both})" in line
    assert line.endswith("Diverged runs (each counted as its arm's worst outcome): horst 1 of 12, adamw 0 of 12.")

    only_90 = {
        **rules,
        "claims": [
            {**RULES["claims"][0], "endpoints": [{"metric": "top1", "first": "horst", "second": "adamw", "at": [0.9]}]}
        ],
    }
    frame = diverged(vit_claim({0.9: 2.0}), "horst", [2, 5, 8])
    judgement = claims.judge(frame, only_90)
    text = report.plain_markdown(
        judgement, claims.verdicts(judgement, only_90), only_90, claims.divergence_rates(frame, only_90)
    )
    assert text.startswith("* **Claim 1 (vit): inconclusive at this scale.**")
    assert "Leaving diverged runs out (complete cases), it would read reproduced." in text
