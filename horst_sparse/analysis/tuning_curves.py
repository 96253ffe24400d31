"""Tuning curves: how good an arm's best validation score is after k = 1..n trials of its search,
with simultaneous confidence bands (Lourie, Cho and He, "Show Your Work with Confidence", 2024,
through their package `opda`). An equal trial count is a fair comparison only at the budget it
fixes: the curves show whether the arms' order holds at every budget or turns on the one chosen.

From a tuning record (`results/tuning/<pipeline>/<recipe>/tuning.csv`: one row per trial of each
arm) per arm: the median tuning curve (the median of the best score of k trials drawn from the
arm's search distribution) with its simultaneous band at CONFIDENCE, from the band of the
scores' CDF (opda's `ld_highest_density`), and the expected best of k trials drawn without
replacement from the arm's n (`expected_best`: the mean best over every k-subset, exact). A failed
trial scores the worst end of the support.

A newer record has a `protocol` column (the study protocol's version) and a `stage` one:
"search" for the N quasi-random trials at the search seed, "rerun" for the top-k of them rerun at
more seeds (same `trial`, another `seed`). The curves are of the search stage alone (they describe the search
distribution, one draw per trial); the pick is the best mean over its seeds among the top k by
search score (`pick`), and `pick_stability` says how often a bootstrap over trials and seeds
changes it. A record without these columns is one unnamed protocol, every row a search trial.
"""

from __future__ import annotations

import math
import subprocess
import textwrap
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from horst_sparse.analysis import tables

CONFIDENCE = 0.80
BAND_SEED = 0  # opda's band construction draws samples: a fixed generator, the same band every time
SEARCH, REFINE, RERUN = "search", "refine", "rerun"
# the stages that sample points, one row per trial at the search seed: the search, and the fresh points of
# its second stage around the best (horst_sparse.tune.refine_space); the pick takes either
SAMPLED = (SEARCH, REFINE)
DRAWS = 2000


def stages(trials: pd.DataFrame) -> pd.Series:
    """Each row's stage; a record without the column, or a row without a stage (an arm tuned
    before the column), is a search trial."""
    return trials["stage"].fillna(SEARCH) if "stage" in trials else pd.Series(SEARCH, index=trials.index)


def _arms(trials: pd.DataFrame) -> list[str]:
    """The record's arms in the fixed order of every table and figure (tables.ARM_ORDER)."""
    present = set(trials.arm)
    return [a for a in tables.ARM_ORDER if a in present] + sorted(present - set(tables.ARM_ORDER))


def expected_best(scores: np.ndarray, ks: np.ndarray, *, maximize: bool) -> np.ndarray:
    """The expected best score of k trials drawn without replacement from `scores`, for each k:
    over all C(n, k) subsets, the i-th worst of n is the best of C(i - 1, k - 1) of them. A search
    draws its trials without replacement; with replacement (the empirical distribution's average
    tuning curve) one failed trial makes every k's expectation the worst end, as k trials can all
    be that one. Here it is the worst end only for k up to the number of failed trials."""
    goodness = np.sort(np.asarray(scores, dtype=float) * (1 if maximize else -1))  # worst first
    n = len(goodness)
    out = []
    for k in ks:
        weights = [math.comb(i - 1, k - 1) / math.comb(n, k) for i in range(1, n + 1)]
        out.append(sum(w * g for w, g in zip(weights, goodness) if w > 0) * (1 if maximize else -1))
    return np.array(out, dtype=float)


def arm_curve(scores: np.ndarray, *, maximize: bool, support: tuple[float, float]) -> pd.DataFrame:
    """k, median, low, high, expected of one arm's trial scores."""
    from opda.nonparametric import EmpiricalDistribution

    low_end, high_end = support
    worst = low_end if maximize else high_end
    ys = np.where(np.isfinite(scores), scores, worst)
    ks = np.arange(1, len(ys) + 1)
    lower_cdf, point, upper_cdf = EmpiricalDistribution.confidence_bands(
        ys, CONFIDENCE, a=low_end, b=high_end, generator=np.random.default_rng(BAND_SEED), n_jobs=1
    )
    minimize = not maximize
    # A CDF band's upper edge is the stochastically smaller distribution: the lower curve, either way.
    return pd.DataFrame(
        {
            "k": ks,
            "median": point.quantile_tuning_curve(ks, minimize=minimize),
            "low": upper_cdf.quantile_tuning_curve(ks, minimize=minimize),
            "high": lower_cdf.quantile_tuning_curve(ks, minimize=minimize),
            "expected": expected_best(ys, ks, maximize=maximize),
        }
    )


def curves(
    trials: pd.DataFrame, *, maximize: bool, support: tuple[float, float] = (-math.inf, math.inf)
) -> pd.DataFrame:
    """Every arm's curve (arm, k, median, low, high, expected), from a tuning record's search
    stage (its reruns are more seeds of the top trials, not more draws from the search)."""
    search = trials[stages(trials) == SEARCH]
    parts = [
        arm_curve(
            search[search.arm == arm].sort_values("trial")["score"].to_numpy(dtype=float),
            maximize=maximize,
            support=support,
        ).assign(arm=arm)
        for arm in _arms(search)
    ]
    return pd.concat(parts, ignore_index=True)[["arm", "k", "median", "low", "high", "expected"]]


def order(curve: pd.DataFrame, *, maximize: bool) -> dict[int, tuple[str, ...]]:
    """The arms, best first by their median curve, at every budget k they all reached."""
    common = curve.groupby("arm").k.max().min()
    ranked = {}
    for k, at in curve[curve.k <= common].groupby("k"):
        ranked[int(k)] = tuple(at.sort_values("median", ascending=not maximize, kind="stable").arm)
    return ranked


def verdict(curve: pd.DataFrame, *, maximize: bool) -> str:
    """Whether the arms' order is the same at every budget, and the budget it is judged at."""
    ranked = order(curve, maximize=maximize)
    final = max(ranked)
    if len(set(ranked.values())) == 1:
        return f"The arms' order ({' > '.join(ranked[final])}) is the same at every budget from 1 to {final} trials."
    changes = [k for k in ranked if k > 1 and ranked[k] != ranked[k - 1]]
    return (
        f"The arms' order changes with the budget (at k = {', '.join(map(str, changes))}); it is judged at the full "
        f"budget, k = {final}: {' > '.join(ranked[final])}."
    )


def _bound(value: float, decimals: int) -> str:
    return ("∞" if value > 0 else "-∞") if math.isinf(value) else tables.number(value, decimals)


def markdown(curve: pd.DataFrame, *, title: str, maximize: bool, decimals: int = 3) -> str:
    shown = curve.assign(
        **{
            "median [band]": [
                f"{_bound(r.median, decimals)} [{_bound(r.low, decimals)}, {_bound(r.high, decimals)}]"
                for r in curve.itertuples()
            ]
        }
    )
    wide = shown.pivot(index="k", columns="arm", values="median [band]")[_arms(curve)].reset_index()
    lines = [
        f"## {title}",
        "",
        f"The median best validation score of k trials, with its simultaneous {100 * CONFIDENCE:g} % band "
        f"(opda, Lourie et al. 2024; {'higher' if maximize else 'lower'} is better). {verdict(curve, maximize=maximize)}",
        "",
        tables.markdown(wide, right=len(wide.columns) - 1),
    ]
    return "\n".join(lines) + "\n"


def _bounded(values: pd.Series, support: tuple[float, float]) -> pd.Series:
    """Which band edges are bounds: finite and short of the support's ends."""
    return np.isfinite(values) & ~values.isin(support)


def axis_range(curve: pd.DataFrame, *, support: tuple[float, float], log_y: bool) -> tuple[float, float]:
    """The figure's y range: the medians and the band edges that are bounds (`_bounded`), padded.
    An edge at the end of the support would squash every curve against the other end."""
    shown = pd.concat(
        [curve["median"], curve.low[_bounded(curve.low, support)], curve.high[_bounded(curve.high, support)]]
    )
    bottom, top = shown.min(), shown.max()
    if log_y:
        pad = (top / bottom) ** 0.06
        return bottom / pad, top * pad
    pad = 0.06 * (top - bottom) or 0.06 * abs(top) or 1.0
    return bottom - pad, top + pad


def figure(
    curve: pd.DataFrame,
    path: Path,
    *,
    title: str,
    ylabel: str,
    log_y: bool = False,
    support: tuple[float, float] = (-math.inf, math.inf),
) -> None:
    """One panel: each arm's median curve, its band shaded and edged (the arms' bands overlap: the
    edges keep each one legible); one colour per arm (tables.arm_color). A band edge at the end of
    the support (few trials cannot bound it there) is not drawn: its shading runs off the axis,
    which is scaled to the medians and the bounded edges, and a note says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bottom, top = axis_range(curve, support=support, log_y=log_y)
    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    arms = _arms(curve)
    for arm in arms:
        part = curve[curve.arm == arm]
        color = tables.arm_color(arm, arms)
        low, high = (
            part.low.where(_bounded(part.low, support), bottom),
            part.high.where(_bounded(part.high, support), top),
        )
        ax.fill_between(part.k, low, high, color=color, alpha=0.10, linewidth=0)
        for edge in ("low", "high"):
            ax.plot(part.k, part[edge].where(_bounded(part[edge], support)), "--", lw=0.8, color=color, alpha=0.7)
        ax.plot(part.k, part["median"], "-o", ms=3, color=color, label=arm)
    ax.set_ylim(bottom, top)
    if log_y:
        ax.set_yscale("log")
    if not (_bounded(curve.low, support).all() and _bounded(curve.high, support).all()):
        ax.text(
            0.01,
            0.01,
            "shading without an edge: the band reaches the end of the support there (too few trials to bound it)",
            transform=ax.transAxes,
            fontsize=6.5,
            va="bottom",
        )
    ax.set_xlabel("trials of the arm's search (k)")
    ax.set_ylabel("\n".join(textwrap.wrap(ylabel, 40)), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(
        fontsize=7, title=f"median best of k; {100 * CONFIDENCE:g} % band", title_fontsize=7, loc="best", frameon=False
    )
    ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=9)  # a long record path must not run off
    fig.savefig(path, dpi=130)
    plt.close(fig)


def by_protocol(trials: pd.DataFrame) -> list[tuple[int | None, pd.DataFrame]]:
    """The record's rows per protocol version, oldest first; rows without a version (an older
    record, or arms tuned before the column) are one unnamed protocol, None."""
    if "protocol" not in trials:
        return [(None, trials)]
    unnamed = trials.protocol.isna()
    named = [(int(v), part) for v, part in trials[~unnamed].groupby("protocol")]
    return ([(None, trials[unnamed])] if unnamed.any() else []) + named


def rerun_trials(trials: pd.DataFrame) -> int:
    """The k of the record: the most trials any arm reran (0 without reruns)."""
    reruns = trials[stages(trials) == RERUN]
    return int(reruns.groupby("arm").trial.nunique().max()) if len(reruns) else 0


def _goodness(scores: pd.Series, *, maximize: bool) -> np.ndarray:
    """Scores as higher-is-better numbers; a failed trial (inf, -inf, NaN) the worst, -inf."""
    values = scores.to_numpy(dtype=float) * (1 if maximize else -1)
    return np.where(np.isfinite(values), values, -math.inf)


def _seeds(rows: pd.DataFrame, *, maximize: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One arm's trials in trial order: their numbers, search scores, every seed's score (a row
    per trial, padded with 0 past its count) and seed counts, all as goodness (`_goodness`)."""
    if "arm" in rows and rows.arm.nunique() > 1:
        raise ValueError(f"the rows of one arm, not of {', '.join(map(str, rows.arm.unique()))}")
    search = rows[stages(rows).isin(SAMPLED)].sort_values("trial", kind="stable")
    if search.trial.duplicated().any() or not set(rows.trial) <= set(search.trial):
        raise ValueError("every trial needs exactly one search row (its reruns: stage 'rerun')")
    ids = search.trial.to_numpy(dtype=int)
    per_trial = [_goodness(rows.score[rows.trial == t], maximize=maximize) for t in ids]
    counts = np.array([len(g) for g in per_trial])
    padded = np.zeros((len(ids), counts.max()))
    for i, g in enumerate(per_trial):
        padded[i, : len(g)] = g
    return ids, _goodness(search.score, maximize=maximize), padded, counts


def _rule(ids: np.ndarray, search: np.ndarray, mean: np.ndarray, top_k: int) -> np.ndarray:
    """The pick rule on each row of (draws x trials) arrays whose columns are in trial order:
    among the top k by search score, the best mean; the earlier trial on a tie at either step.
    k = 0 (no reruns) is the best search score, the same as k = 1."""
    k = min(max(top_k, 1), ids.shape[1])
    top = np.argsort(-search, axis=1, kind="stable")[:, :k]
    candidates, means = np.take_along_axis(ids, top, axis=1), np.take_along_axis(mean, top, axis=1)
    best = np.lexsort((candidates, -means), axis=-1)[:, 0]
    return candidates[np.arange(len(ids)), best]


class NoStablePick(ValueError):
    """Every trial a guarded pick could take is unstable (`Stability`)."""


def pick(rows: pd.DataFrame, *, maximize: bool, top_k: int, stability: Stability | None = None) -> int:
    """The picked trial of one arm's rows (search and rerun): among the top_k trials by their
    search score, the best mean over its seeds; the earlier trial on a tie. A failed score (not
    finite) is the worst. With no reruns (top_k 0 or an older record), the best search score.

    With a `stability` guard the candidates are the top_k stable trials of the search stage
    (`stable_top`), and a candidate that turned unstable in its reruns (a seed failed there, or
    next to it) is out: NoStablePick, naming each candidate's reason, where none is left."""
    if stability is None:
        ids, search, seeds, counts = _seeds(rows, maximize=maximize)
        return int(_rule(ids[None], search[None], (seeds.sum(axis=1) / counts)[None], top_k)[0])
    candidates = stable_top(rows, maximize=maximize, top_k=top_k, stability=stability)
    unstable = stability.unstable(rows)
    kept = [t for t in candidates if t not in unstable]
    if not kept:
        reasons = "; ".join(f"trial {t}: {unstable[t]}" for t in candidates or sorted(unstable) if t in unstable)
        raise NoStablePick(f"no stable trial among the top {top_k} of {rows.arm.iloc[0]}: {reasons or 'none ran'}")
    part = rows[rows.trial.isin(kept)]
    ids, search, seeds, counts = _seeds(part, maximize=maximize)
    return int(_rule(ids[None], search[None], (seeds.sum(axis=1) / counts)[None], len(kept))[0])


@dataclass(frozen=True)
class Stability:
    """A pick rule's guard against a stability cliff: a trial is unstable where one of its seeds
    failed, or where a trial within `radius` of it failed at any seed. Distance is L-infinity in the
    unit cube of the searched keys (`space`: key -> (low, high, log): a log key on the log scale),
    the cube the quasi-random points fill, so a radius means the same share of every key's range."""

    space: dict[str, tuple[float, float, bool]]
    radius: float

    def unit(self, rows: pd.DataFrame) -> np.ndarray:
        """The rows' points in the unit cube (a row per row, a column per key of the space)."""
        columns = []
        for key, (low, high, log) in self.space.items():
            if key not in rows:
                raise ValueError(f"the tuning record has no column {key}, a key of the search space")
            values = rows[key].to_numpy(dtype=float)
            if log:
                values, low, high = np.log(values), math.log(low), math.log(high)
            columns.append((values - low) / (high - low))
        return np.stack(columns, axis=1)

    def unstable(self, rows: pd.DataFrame) -> dict[int, str]:
        """One arm's unstable trials, each with why in words (which trial failed, at what distance)."""
        failed = rows[~np.isfinite(rows.score.to_numpy(dtype=float))]
        search = rows[stages(rows).isin(SAMPLED)].drop_duplicates("trial")
        points = dict(zip(search.trial.astype(int), self.unit(search)))
        why = {}
        for trial, point in points.items():
            if trial in set(failed.trial):
                why[trial] = f"trial {trial} failed at seed {int(failed[failed.trial == trial].seed.iloc[0])}"
                continue
            near = [
                (float(np.abs(points[other] - point).max()), int(other))
                for other in sorted(set(failed.trial.astype(int)))
                if np.abs(points[other] - point).max() <= self.radius
            ]
            if near:
                distance, other = min(near)
                why[trial] = f"trial {other}, {distance:.3f} from it (radius {self.radius:g}), failed"
        return why


def stable_top(rows: pd.DataFrame, *, maximize: bool, top_k: int, stability: Stability) -> list[int]:
    """The trials to rerun under a stability guard: the top k by search score among the search
    stage's stable trials (a trial next to a failed one is never rerun, so the budget of reruns
    goes to trials that can be picked)."""
    search = rows[stages(rows).isin(SAMPLED)]
    unstable = stability.unstable(search)
    kept = search[~search.trial.isin(unstable)]
    order = np.argsort(-_goodness(kept.score, maximize=maximize), kind="stable")
    return [int(t) for t in kept.trial.to_numpy()[order][: max(top_k, 1)]]


def _bootstrap(
    rows: pd.DataFrame, *, maximize: bool, top_k: int, draws: int, seed: int, held_out: Collection[int] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """Each bootstrap draw of one arm (see `pick_stability`): its picked trial and its trials."""
    ids, search, seeds, counts = _seeds(rows, maximize=maximize)
    rng = np.random.default_rng(seed)
    drawn = np.sort(rng.integers(len(ids), size=(draws, len(ids))), axis=1)  # sorted: columns in trial order
    n = counts[drawn]
    at = rng.integers(n[..., None], size=(*drawn.shape, seeds.shape[1]))  # each copy's seeds, with replacement
    kept = np.arange(seeds.shape[1]) < n[..., None]
    mean = np.where(kept, seeds[drawn[..., None], at], 0.0).sum(axis=2) / n
    return _rule_without(held_out, ids[drawn], search[drawn], mean, top_k), ids[drawn]


def _rule_without(held_out: Collection[int], ids: np.ndarray, search: np.ndarray, mean: np.ndarray, top_k: int):
    """`_rule` with the `held_out` trials never a candidate: the worst search score and mean."""
    out = np.isin(ids, list(held_out))
    return _rule(ids, np.where(out, -math.inf, search), np.where(out, -math.inf, mean), top_k)


def pick_stability(
    rows: pd.DataFrame,
    *,
    maximize: bool,
    top_k: int,
    draws: int = DRAWS,
    seed: int = 0,
    held_out: Mapping[str, Collection[int]] | None = None,
) -> pd.DataFrame:
    """How often a bootstrap over trials and seeds changes each arm's pick.

    A draw resamples the arm's N search trials with replacement (each copy is a trial of its own,
    so a trial drawn twice may fill two of the top k) and, for every copy of a trial with reruns,
    its seed scores with replacement, as many as it has (a trial with one seed keeps it). The rule
    of `pick` then runs on the draw: the top k copies by their search score (a trial's search
    score is not resampled: drawing the trials is the search stage's variation), then the best
    mean of the copy's resampled seed scores (the single score of a trial without reruns). A draw
    that picks another trial, or holds no copy of the pick at all (expected share (1 - 1/N)^N,
    36 % at N = 16), changed it. Every arm's generator starts from `seed`: its numbers do not
    depend on the record's other arms.

    One row per arm (tables.ARM_ORDER): trials (N), top_k, seeds (of each rerun trial, the
    search seed included; the fewest if they differ; 1 without reruns), pick, pick_score (its
    mean over its seeds), draws, changed and absent (shares of draws: the pick changed; the pick
    not drawn), runner_up (the trial most often picked instead; the earlier on a tie; empty if
    none) and runner_up_share (of all draws).

    `held_out`: per arm, the trials the tuning's stability guard kept from its pick (`guarded`);
    they are never candidates, in the pick and in every draw, as in the tuning (the guard held
    fixed: a draw does not ask again which trials lie near a failed one). Listed in `held_out`."""
    table = []
    for arm in _arms(rows):
        part = rows[rows.arm == arm]
        out = sorted((held_out or {}).get(arm, ()))
        ids, search, seeds, counts = _seeds(part, maximize=maximize)
        chosen = int(_rule_without(out, ids[None], search[None], (seeds.sum(axis=1) / counts)[None], top_k)[0])
        picked, drawn = _bootstrap(part, maximize=maximize, top_k=top_k, draws=draws, seed=seed, held_out=out)
        other, times = np.unique(picked[picked != chosen], return_counts=True)
        at = int(np.flatnonzero(ids == chosen)[0])
        score = seeds[at, : counts[at]].mean() * (1 if maximize else -1)
        table.append(
            {
                "arm": arm,
                "trials": len(ids),
                "top_k": top_k,
                "seeds": int(counts[counts > 1].min()) if (counts > 1).any() else 1,
                "pick": chosen,
                "pick_score": score,
                "draws": draws,
                "changed": float(np.mean(picked != chosen)),
                "absent": float(np.mean(~(drawn == chosen).any(axis=1))),
                "runner_up": int(other[times.argmax()]) if len(other) else pd.NA,
                "runner_up_share": times.max() / draws if len(other) else 0.0,
                "held_out": " ".join(map(str, out)),
            }
        )
    return pd.DataFrame(table).astype({"runner_up": "Int64"})


def _percent(share: float) -> str:
    return f"{100 * share:.0f} %"


def _protocol(version: int | None) -> str:
    return "" if version is None else f", protocol v{version}"


def recorded_picks(trials: pd.DataFrame) -> dict[str, int]:
    """The trial each arm's `pick` column marks (the record's own pick)."""
    marked = trials[trials["pick"].astype(str) == "True"] if "pick" in trials else trials.iloc[:0]
    return {str(arm): int(trial) for arm, trial in marked.groupby("arm").trial.first().items()}


def guarded(tuned: Path, version: int) -> dict[str, dict[int, str]]:
    """Per arm, the trials protocol `version`'s stability guard kept from its pick, each with why,
    as the tuned file recorded them beside that version's pick (provenance.stability): the file as
    it stands, else the newest commit of it where the arm's pick is that version's (git, the
    ledger: a later version's tuning replaces the section). An arm whose pick ran no guard is absent."""

    def versions_of_the_file() -> Iterator[dict]:
        yield yaml.safe_load(tuned.read_text()) or {}
        git = ["git", "-C", str(tuned.parent)]
        commits = subprocess.run([*git, "log", "--format=%H", "--", tuned.name], capture_output=True, text=True)
        for commit in commits.stdout.split():
            shown = subprocess.run([*git, "show", f"{commit}:./{tuned.name}"], capture_output=True, text=True)
            if shown.returncode == 0:
                yield yaml.safe_load(shown.stdout) or {}

    found: dict[str, dict[int, str] | None] = {}
    for sections in versions_of_the_file():
        for arm, section in sections.items():
            provenance = (section.get("provenance") if isinstance(section, dict) else None) or {}
            if arm not in found and (provenance.get("protocol") or {}).get("version") == version:
                stability = provenance.get("stability")
                found[arm] = (
                    None if stability is None else {int(t): w for t, w in (stability["unstable"] or {}).items()}
                )
    return {arm: trials for arm, trials in found.items() if trials is not None}


def stability_markdown(
    table: pd.DataFrame,
    *,
    title: str,
    maximize: bool,
    recorded: dict[str, int],
    held_out: Mapping[str, Mapping[int, str]] | None = None,
) -> str:
    """A section of pick_stability.md: the rule, one sentence per arm, the table. An arm whose
    record marks another trial than the rule's pick says so: the record and this reading disagree.
    `held_out` (`guarded`): the trials the tuning's stability guard kept from each arm's pick."""
    k = int(table.top_k.iloc[0])
    guard = " that the tuning's stability guard did not hold out" if held_out else ""
    rule = (
        f"among the top {k} trials by search score{guard}, the one with the best mean over its seeds"
        if k
        else "the trial with the best search score (no reruns)"
    )
    resampled = "an arm's search trials and each rerun trial's seeds" if k else "an arm's search trials"
    lines = [
        f"## {title}",
        "",
        f"The pick is {rule}; {'higher' if maximize else 'lower'} is better, and the earlier trial wins a tie. "
        f"Each of {table.draws.iloc[0]} bootstrap draws resamples {resampled} with replacement and applies the "
        "same rule (`pick_stability`); a draw without the pick changed it.",
        "",
    ]
    for r in table.itertuples():
        sentence = (
            f"- {r.arm}'s pick (trial {r.pick}) changes in {_percent(r.changed)} of {r.draws} bootstrap draws; "
            f"{_percent(r.absent)} of the draws hold no copy of it ((1 - 1/N)^N = "
            f"{_percent((1 - 1 / r.trials) ** r.trials)} expected)"
        )
        if not pd.isna(r.runner_up):
            sentence += f"; trial {r.runner_up} is picked most often instead ({_percent(r.runner_up_share)})"
        if (out := (held_out or {}).get(r.arm)) is not None:
            which = "; ".join(f"trial {t} ({why})" for t, why in sorted(out.items())) or "no trial"
            sentence += f". The tuning's stability guard (the tuned file's provenance) held out {which}, here too"
        if recorded.get(r.arm, r.pick) != r.pick:
            sentence += f". The record's pick column marks trial {recorded[r.arm]}, not this rule's pick"
        lines.append(sentence + ".")
    shown = pd.DataFrame(
        {
            "arm": table.arm,
            "trials": table.trials,
            "top k": table.top_k,
            "seeds": table.seeds,
            "pick": table.pick,
            "pick score": [_bound(v, 3) for v in table.pick_score],
            "changed": table.changed.map(_percent),
            "absent": table.absent.map(_percent),
            "runner-up": [
                "–" if pd.isna(t) else f"{t} ({_percent(s)})" for t, s in zip(table.runner_up, table.runner_up_share)
            ],
        }
    )
    return "\n".join([*lines, "", tables.markdown(shown)])


REPEAT_KEYS = ["arm", "stage", "trial", "seed"]  # and every searched value (the columns named `group.key`)


def repeats(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials a later protocol version ran again, at another commit: the same arm, stage, trial,
    seed and searched values (v4 redid v3's AdamW and HORST tunings on the same points). Per arm and pair of
    versions: how many, how many scored the same to the last bit, and the largest difference,
    a check that a tuning reproduces."""
    columns = ["arm", "earlier", "later", "trials", "identical", "max_difference"]
    if "protocol" not in trials:
        return pd.DataFrame(columns=columns)
    keys = [*REPEAT_KEYS, *(c for c in trials.columns if "." in c)]
    versioned = trials[trials.protocol.notna()]
    versions = sorted(versioned.protocol.unique())
    rows = []
    for i, earlier in enumerate(versions):
        for later in versions[i + 1 :]:
            both = versioned[versioned.protocol == earlier].merge(
                versioned[versioned.protocol == later], on=keys, suffixes=("_earlier", "_later")
            )  # pandas matches missing values (an arm's unsearched keys) as equal
            if "commit" in trials:  # a row both versions hold (recorded after the fact) is not a rerun
                both = both[both.commit_earlier != both.commit_later]
            for arm, pairs in both.groupby("arm", sort=False):
                difference = (pairs.score_later - pairs.score_earlier).abs()
                rows.append([arm, int(earlier), int(later), len(pairs), int((difference == 0).sum()), difference.max()])
    return pd.DataFrame(rows, columns=columns)


def repeats_markdown(table: pd.DataFrame, *, title: str) -> str:
    lines = [
        f"## {title}",
        "",
        "Trials of two versions at the same points (every searched value) and seeds, made at different "
        "commits. A difference comes from a setting outside the searched keys that the two versions changed "
        "(their protocol files say which) or from arithmetic that did not repeat.",
        "",
    ]
    for row in table.itertuples():
        lines.append(
            f"- {row.arm}: {row.trials} trials of protocol v{row.earlier} at the same points and seeds under "
            f"v{row.later}; {row.identical} scored the same to the last bit, the largest difference "
            f"{row.max_difference:.3g}."
        )
    return "\n".join(lines) + "\n"


def _opda_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("opda")


def write_curves(
    trials: pd.DataFrame,
    out: Path,
    *,
    version: int | None,
    top_k: int,
    title: str,
    written_by: str,
    maximize: bool,
    support: tuple[float, float],
    log_y: bool,
    stem: str | None = None,
) -> str:
    """One protocol's curves of the search stage: tuning_curves.md, .csv and .png (with
    _v<version> for a versioned protocol, or `stem`); returns the markdown. top_k: the trials each arm reran."""
    stem = stem or ("tuning_curves" if version is None else f"tuning_curves_v{version}")
    curve = curves(trials, maximize=maximize, support=support)
    scope = (
        f" The curves are of the search stage alone (each arm's trials at its search seed); the reruns of "
        f"the top {top_k} are in pick_stability.md."
        if top_k
        else ""
    )
    text = f"{written_by} (opda {_opda_version()}).{scope}\n\n" + markdown(curve, title=title, maximize=maximize)
    (out / f"{stem}.md").write_text(text)
    tables.write_csv(curve, out / f"{stem}.csv")
    figure(curve, out / f"{stem}.png", title=title, ylabel=str(trials.metric.iloc[0]), log_y=log_y, support=support)
    return text


def as_run(trials: pd.DataFrame, version: int, inherited_from: int) -> tuple[pd.DataFrame, list[str]]:
    """The tuning rows of every arm `version` ran: its own tunings, and for an arm it did not tune,
    the tuning of `inherited_from` whose pick it runs at; and the arms so inherited."""
    own = trials[trials.protocol == version]
    earlier = trials[(trials.protocol == inherited_from) & ~trials.arm.isin(set(own.arm))]
    return pd.concat([own, earlier]), _arms(earlier) if len(earlier) else []


def main(argv: list[str] | None = None) -> None:
    """`horst-sparse tuning-curves`: the tuning curves of a tuning record, and how stable its picks are.

        horst-sparse tuning-curves results/tuning/vit/mnist1d/tuning.csv --maximize --support 0 1
        horst-sparse tuning-curves results/tuning/gpt2/pydoc/tuning.csv --support 1 inf --log

    Writes, beside the record (or into --out), per protocol version of the record:
    tuning_curves_v<version>.md, .csv and .png (a record without a protocol column:
    tuning_curves.md, .csv, .png), the curves of the search stage; and pick_stability.md and .csv,
    one section (a `protocol` column) per version: how often a bootstrap over trials and seeds
    changes each arm's pick; and, where a later version ran trials of an earlier one again (the
    same points and seeds), repeats.md and .csv: whether they scored the same. The markdown is
    also printed."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="horst-sparse tuning-curves",
        description=(main.__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(main.__doc__ or "").split("\n\n", 1)[1],
    )
    parser.add_argument("record", type=Path, help="a tuning record (tuning.csv)")
    parser.add_argument("--maximize", action="store_true", help="higher scores are better (default: lower)")
    parser.add_argument("--support", nargs=2, type=float, default=(-math.inf, math.inf), metavar=("LOW", "HIGH"),
                        help="the scores' possible range (top-1: 0 1; perplexity: 1 inf); a failed trial scores its worst end")  # fmt: skip
    parser.add_argument("--log", action="store_true", help="a log-scale score axis (perplexity)")
    parser.add_argument("--draws", type=int, default=DRAWS, help=f"bootstrap draws of the pick (default {DRAWS})")
    parser.add_argument("--out", type=Path, help="the folder to write (default: the record's)")
    parser.add_argument("--tuned", type=Path, metavar="FILE",
                        help="the arms' tuned file (configs/tuned/<pipeline>/<recipe>.yaml): a version whose tuning "
                             "ran a stability guard is read with the trials the guard held out, from the file's "
                             "provenance and its git history")  # fmt: skip
    parser.add_argument("--inherit", action="append", default=[], metavar="V=U",
                        help="version V runs the picks of version U's tuning for the arms it does not tune itself: "
                             "also write V's curves of every arm as it ran them (tuning_curves_v<V>_as_run.*)")  # fmt: skip
    args = parser.parse_args(argv)
    inherits = []
    for spec in args.inherit:
        version, _, source = spec.partition("=")
        if not (version.isdigit() and source.isdigit()):
            sys.exit(f"error: --inherit {spec}: give V=U, two protocol versions, e.g. --inherit 6=4")
        inherits.append((int(version), int(source)))
    if not args.record.is_file():
        sys.exit(f"error: no tuning record {args.record}: give a tuning.csv that horst-sparse tune wrote")
    if args.tuned is not None and not args.tuned.is_file():
        sys.exit(f"error: no tuned file {args.tuned}: give the file the tuning wrote its picks to, configs/tuned/...")
    trials = pd.read_csv(args.record)
    out = args.out or args.record.parent
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["horst-sparse tuning-curves", *(argv if argv is not None else sys.argv[1:])])
    written_by = f"Written by `{command}` from the record"
    texts, sections, stability = [], [], []
    for version, part in by_protocol(trials):
        arms = ", ".join(_arms(part))
        top_k = rerun_trials(part)
        title = f"Tuning curves of {arms}{_protocol(version)}{', search stage' if top_k else ''} ({args.record})"
        texts.append(
            write_curves(
                part,
                out,
                version=version,
                top_k=top_k,
                title=title,
                written_by=written_by,
                maximize=args.maximize,
                support=tuple(args.support),
                log_y=args.log,
            )
        )
        held_out = guarded(args.tuned, version) if args.tuned is not None and version is not None else {}
        table = pick_stability(part, maximize=args.maximize, top_k=top_k, draws=args.draws, held_out=held_out)
        sections.append(
            stability_markdown(
                table,
                title=f"Pick stability of {arms}{_protocol(version)} ({args.record})",
                maximize=args.maximize,
                recorded=recorded_picks(part),
                held_out=held_out,
            )
        )
        stability.append(
            table.assign(protocol=version)[["protocol", *table.columns]] if "protocol" in trials else table
        )
    for version, source in inherits:
        if "protocol" not in trials or not (trials.protocol == source).any():
            sys.exit(f"error: --inherit {version}={source}: the record has no tuning of protocol v{source}")
        part, inherited = as_run(trials, version, source)
        title = (
            f"Tuning curves of {', '.join(_arms(part))}, protocol v{version} as run ({', '.join(inherited)}: "
            f"v{source}'s tuning), search stage ({args.record})"
        )
        texts.append(
            write_curves(
                part, out, version=version, top_k=rerun_trials(part), title=title, written_by=written_by,
                maximize=args.maximize, support=tuple(args.support), log_y=args.log,
                stem=f"tuning_curves_v{version}_as_run",
            )
        )  # fmt: skip
    texts.append(f"{written_by}.\n\n" + "\n".join(sections))
    (out / "pick_stability.md").write_text(texts[-1])
    tables.write_csv(pd.concat(stability, ignore_index=True), out / "pick_stability.csv")
    repeated = repeats(trials)
    if not repeated.empty:
        texts.append(
            f"{written_by}.\n\n"
            + repeats_markdown(repeated, title=f"Trials repeated by a later protocol version ({args.record})")
        )
        (out / "repeats.md").write_text(texts[-1])
        tables.write_csv(repeated, out / "repeats.csv")
    print("\n".join(texts))
