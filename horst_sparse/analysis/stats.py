"""The statistics: a cell's mean and spread, paired t-intervals over seeds, Holm's correction
over a family of tests, and the smallest effect a paired test could detect.

Paired, because every arm of a study runs the same seeds (data order, initialisation): the
seed-to-seed spread, as large as the effects on small benchmarks, cancels in the per-seed
difference. Student's t, because with 5-10 seeds the sample std is itself uncertain.
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
