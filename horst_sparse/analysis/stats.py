"""The statistics: a cell's mean and spread, paired t-intervals over seeds, the sign-flip
permutation test of the same differences, Holm's correction over a family of tests, and the
smallest effect a paired test could detect.

Paired, because every arm of a study runs the same seeds (data order, initialisation): the
seed-to-seed spread, as large as the effects on small benchmarks, cancels in the per-seed
difference. Student's t, because with 5-10 seeds the sample std is itself uncertain. The
sign-flip test assumes no normality (only that a difference's sign is as likely either way
under the null), the check that a verdict does not hang on the t-test's assumption.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize, stats


def spread(values: pd.Series) -> pd.Series:
    """mean, std (sample; NaN for one value), n over the finite values; `diverged` the others."""
    finite = values[np.isfinite(values)]
    return pd.Series(
        {"mean": finite.mean(), "std": finite.std(ddof=1), "n": len(finite), "diverged": len(values) - len(finite)}
    )


@dataclass(frozen=True)
class Interval:
    """The mean of n paired differences, its two-sided t-interval, its t-test's p-value
    against 0 and the differences' sample std (NaN for fewer than 2)."""

    mean: float
    low: float
    high: float
    n: int
    p: float
    sd: float


def paired_interval(differences: Sequence[float], confidence: float) -> Interval:
    d = np.asarray(differences, dtype=float)
    n = len(d)
    if n < 2:
        return Interval(float(d.mean()) if n else math.nan, math.nan, math.nan, n, math.nan, math.nan)
    sd = float(d.std(ddof=1))
    half = stats.t.ppf((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    p = float(stats.ttest_1samp(d, 0.0).pvalue) if sd > 0 else (0.0 if d.mean() != 0 else 1.0)
    return Interval(float(d.mean()), float(d.mean() - half), float(d.mean() + half), n, p, sd)


SIGN_FLIP_EXACT = 16  # up to this many differences every sign pattern (2^16), beyond it as many random ones
SIGN_FLIP_SEED = 0


def sign_flip_p(differences: Sequence[float]) -> float:
    """Two-sided sign-flip permutation p-value of paired differences against 0 (statistic |mean|):
    the share of sign patterns whose |mean| reaches the observed one. Exact over all 2^n patterns
    for n <= SIGN_FLIP_EXACT, else 2^SIGN_FLIP_EXACT random patterns (fixed seed) plus the observed
    one. NaN for no differences at all. The smallest p is 2 / 2^n: 5 pairs never reach below 0.0625."""
    d = np.asarray(differences, dtype=float)
    n = len(d)
    if n == 0:
        return math.nan
    observed = abs(d.sum())  # |mean| up to the constant n
    tolerance = 1e-9 * np.abs(d).sum()  # sums of the same numbers in another order tie
    if n <= SIGN_FLIP_EXACT:
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
        return float(np.mean(np.abs(signs @ d) >= observed - tolerance))
    rng = np.random.default_rng(SIGN_FLIP_SEED)
    draws, reached = 2**SIGN_FLIP_EXACT, 1  # the observed pattern counts: p is never 0
    for start in range(0, draws, 4096):  # in blocks: n may be large
        signs = rng.choice([-1.0, 1.0], size=(min(4096, draws - start), n))
        reached += int(np.sum(np.abs(signs @ d) >= observed - tolerance))
    return reached / (draws + 1)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and does not count in the family)."""
    p = np.asarray(pvalues, dtype=float)
    tested = np.flatnonzero(np.isfinite(p))
    adjusted = np.full(len(p), math.nan)
    running = 0.0
    for rank, i in enumerate(tested[np.argsort(p[tested], kind="stable")]):
        running = max(running, min(1.0, (len(tested) - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def detectable_effect(sd: float, n: int, *, alpha: float, power: float) -> float:
    """The smallest true mean difference a two-sided paired t-test at level `alpha` detects with
    probability `power`, for n pairs whose differences have std `sd` (noncentral t)."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    if sd == 0:
        return 0.0
    df, critical = n - 1, stats.t.ppf(1 - alpha / 2, n - 1)

    def shortfall(effect: float) -> float:
        nc = effect * math.sqrt(n) / sd
        lower = stats.nct.cdf(-critical, df, nc)  # the wrong tail; scipy gives NaN where it is ~0
        return stats.nct.sf(critical, df, nc) + (lower if math.isfinite(lower) else 0.0) - power

    return float(optimize.brentq(shortfall, 0.0, (critical + 8) * sd / math.sqrt(n)))  # power ~1 there


def signed_rank_p(differences: Sequence[float]) -> float:
    """Two-sided exact Wilcoxon signed-rank p-value of paired differences against 0: the sign-flip
    test of their signed ranks (ranks of |d|, ties averaged; zeros dropped, Wilcoxon's rule). An
    infinite difference (a diverged run, counted as the worst or best outcome) takes the highest
    rank: it counts as large as any, and no larger. NaN where no difference is non-zero."""
    d = np.asarray(differences, dtype=float)
    d = d[d != 0]
    if len(d) == 0:
        return math.nan
    return sign_flip_p(np.sign(d) * stats.rankdata(np.abs(d)))


def median_interval(values: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """(median, low, high): the distribution-free interval for the median from order statistics,
    [x_(k), x_(n+1-k)] with the largest k whose exact binomial coverage is at least `confidence`
    (infinite bounds where n is too small for one). Infinite values count as the extremes they
    stand for, so a diverged run moves the interval by its rank, not by a made-up number."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan
    middle = x[(n - 1) // 2 : n // 2 + 1]
    median = float(middle.mean()) if np.isfinite(middle).all() else float(middle[-1])  # inf and -inf: the upper
    k = 0
    while k + 1 <= n // 2 and 1 - 2 * stats.binom.cdf(k, n, 0.5) >= confidence:
        k += 1  # coverage of [x_(k+1), x_(n-k)]: P(k < B <= n-k-1) = 1 - 2 P(B <= k)
    if k == 0:
        return median, -math.inf, math.inf
    return median, float(x[k - 1]), float(x[n - k])


def rate_interval(events: int, trials: int, confidence: float) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a rate, `events` of `trials`."""
    if trials == 0:
        return math.nan, math.nan
    ci = stats.binomtest(events, trials).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)
