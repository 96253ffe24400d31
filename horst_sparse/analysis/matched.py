"""An arm's pruned perplexity against the one a reference arm (AdamW) has at the same dense
perplexity, seed by seed: claim 2 at matched dense quality.

A less trained model loses less to pruning, so a plain ratio of pruned perplexities partly
measures how far each arm's training got. A GPT-2 run with `prune.at_steps` measures its dense and
pruned perplexities during training (curve points, horst_sparse.analysis.runs); with its final
numbers they are the run's curve, a point (dense perplexity, pruned perplexity at sparsity s) per
measured step and the final one. The reference seed's curve, its points ordered by dense
perplexity, gives its pruned perplexity at any dense perplexity inside its range, piecewise linear
in (log dense, log pruned) (`interpolate`). The endpoint of an arm at s, per seed: log(the arm's
final pruned perplexity / the reference seed's interpolated at the arm's final dense perplexity).

No extrapolation: a seed whose dense perplexity lies outside its reference seed's curve (lower than
the reference ever got, or higher than its first measured point) is not comparable; it stays out
of the pairs, listed and counted (`Matched.outside`). A diverged run counts as the rules say
(horst_sparse.analysis.claims.counted_gains).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

STEP = "step"  # a curve point's update (horst_sparse.analysis.runs: the tidy frame); final numbers have none
KEYS = ["run", "arm", "seed", STEP]  # one point of one run's curve; the final one's step is NaN


def curve_points(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows measured during training (horst_sparse.analysis.runs); empty where no run measured a curve."""
    return frame[frame[STEP].notna()] if STEP in frame else frame[:0]


def final_numbers(frame: pd.DataFrame) -> pd.DataFrame:
    """The runs' final numbers: every row but the curve points; `frame` itself where it has none."""
    return frame[frame[STEP].isna()] if STEP in frame else frame


def curves(frame: pd.DataFrame, pipeline: str, *, metric: str, method: str, pattern: str) -> pd.DataFrame:
    """Every run's curve: one row per (run, step, sparsity) with its `dense` and `pruned` value of
    `metric` (`method`, `pattern` at `sparsity`); the curve points' metric is `<metric>_curve`, the
    final point's step NaN. In training order, the final point last."""
    rows = frame[frame.pipeline == pipeline]
    final, during = final_numbers(rows), curve_points(rows)
    points = pd.concat(
        [final[final.metric == metric], during[during.metric == f"{metric}_curve"]], ignore_index=True
    ).reindex(columns=[*KEYS, "method", "pattern", "sparsity", "value"])
    dense = points[(points.method == "none") & (points.pattern == "dense")]
    pruned = points[(points.method == method) & (points.pattern == pattern)]
    joined = pruned[[*KEYS, "sparsity", "value"]].merge(
        dense[[*KEYS, "value"]].rename(columns={"value": "dense"}), on=KEYS
    )
    joined = joined.rename(columns={"value": "pruned"}).astype({STEP: float})
    return joined.sort_values(["run", "sparsity", STEP], na_position="last", kind="stable").reset_index(drop=True)


def interpolate(dense: Sequence[float], pruned: Sequence[float], at: float) -> float:
    """The pruned perplexity of a curve (its points' `dense` and `pruned` perplexities) at dense
    perplexity `at`: piecewise linear in (log dense, log pruned) between the points ordered by
    dense perplexity (points of one dense perplexity: the mean of their logs); NaN where `at` lies
    outside the points' range, or a point is not finite (it is left out)."""
    x, y = np.log(np.asarray(dense, dtype=float)), np.log(np.asarray(pruned, dtype=float))
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    target = math.log(at) if at > 0 else math.nan
    if not len(x) or not (x.min() <= target <= x.max()):
        return math.nan
    ordered, inverse = np.unique(x, return_inverse=True)
    mean = np.bincount(inverse, weights=y) / np.bincount(inverse)
    return math.exp(float(np.interp(target, ordered, mean)))


@dataclass
class Matched:
    """A matched endpoint's per-seed log ratios, and the seeds that are not comparable."""

    gains: pd.Series  # seed -> log(first's pruned / second's interpolated), the seeds compared
    outside: dict = field(default_factory=dict)  # seed -> (its dense ppl, the reference curve's lowest, highest)
    seeds: int = 0  # the seeds of `first` with both final numbers and a reference curve

    def words(self, first: str, second: str) -> str:
        """The seeds not comparable, counted and named; '' where none."""
        if not self.outside:
            return ""
        shown = "; ".join(
            f"seed {seed:g} at {dense:.4g}, the curve {low:.4g}-{high:.4g}"
            for seed, (dense, low, high) in sorted(self.outside.items())
        )
        return (
            f"{len(self.outside)} of {self.seeds} {first} seeds not comparable, their dense perplexity outside "
            f"{second}'s curve: {shown}"
        )


def matched_gains(
    frame: pd.DataFrame,
    pipeline: str,
    first: str,
    second: str,
    sparsity: float,
    *,
    metric: str = "ppl",
    method: str = "magnitude",
    pattern: str = "unstructured",
) -> Matched:
    """Per seed, log(`first`'s final pruned perplexity at `sparsity` / `second`'s at `first`'s final
    dense perplexity, interpolated on the same seed's curve of `second`); a seed without both final
    numbers or without a run of `second` has no gain (claims.unpaired says why)."""
    table = curves(frame, pipeline, metric=metric, method=method, pattern=pattern)
    table = table[np.isclose(table.sparsity, sparsity)]
    mine = table[(table.arm == first) & table[STEP].isna()]
    reference = table[table.arm == second]
    gains, outside, seeds = {}, {}, 0
    for row in mine.itertuples():
        curve = reference[reference.seed == row.seed]
        if curve.empty or not (math.isfinite(row.dense) and math.isfinite(row.pruned)):
            continue
        seeds += 1
        at = interpolate(curve.dense, curve.pruned, row.dense)
        if math.isnan(at):
            finite = curve.dense[np.isfinite(curve.dense) & np.isfinite(curve.pruned)]
            outside[row.seed] = (row.dense, finite.min(), finite.max())
            continue
        gains[row.seed] = math.log(row.pruned) - math.log(at)
    return Matched(pd.Series(gains, dtype=float), outside, seeds)
