"""The judge of the paper's claims: the one code that turns numbers into verdicts, by the rules
of `claims.yaml` (the one place they are stated; read it for what "supports" means).

    judgement = judge(frame, load_rules())       # one row per endpoint
    verdicts(judgement, rules)                   # one row per claim
    sensitivity(judgement)                       # the endpoints the sign-flip test would judge otherwise
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from horst_sparse.analysis.matched import final_numbers, matched_gains
from horst_sparse.analysis.stats import (
    detectable_effect,
    holm,
    median_interval,
    paired_interval,
    rate_interval,
    sign_flip_p,
    signed_rank_p,
)

RULES = Path(__file__).with_name("claims.yaml")
SUPPORTS, CONTRADICTS, UNDECIDED, NOT_TESTABLE = "supports", "contradicts", "undecided", "not testable"
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTED = (
    "reproduced",
    "not reproduced",
    "inconclusive at this scale",
    "not tested (no endpoint has two seeds)",
)


def load_rules(path: Path = RULES) -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text())


def pct(sparsity: float) -> str:
    return "dense" if sparsity == 0 else f"{100 * sparsity:g} %"


def _rows(frame: pd.DataFrame, pipeline: str, metric: str, method: str, pattern: str) -> pd.DataFrame:
    return frame[
        (frame.pipeline == pipeline) & (frame.metric == metric) & (frame.method == method) & (frame.pattern == pattern)
    ]


def per_seed(frame: pd.DataFrame, pipeline: str, metric: str, method: str, pattern: str) -> pd.DataFrame:
    """seed x (arm, sparsity) of one pipeline's metric; the log where the metric is a ratio's."""
    rows = _rows(frame, pipeline, metric, method, pattern)
    twice = rows[rows.duplicated(["arm", "sparsity", "seed"], keep=False)]
    if not twice.empty:
        first = twice.iloc[0]
        raise ValueError(
            f"{pipeline} {first.arm} at {pct(first.sparsity)} has several runs of seed {first.seed} "
            f"({', '.join(twice[(twice.arm == first.arm) & (twice.seed == first.seed)].run)}): "
            "judge one study at a time"
        )
    return rows.pivot_table(index="seed", columns=["arm", "sparsity"], values="value", aggfunc="first", dropna=False)


def paired_gains(table: pd.DataFrame, first: str, second: str, sparsity: float, *, log: bool) -> pd.Series:
    """Per-seed first - second (log ratio) at `sparsity`; only seeds with both finite."""
    if (first, sparsity) not in table or (second, sparsity) not in table:
        return pd.Series(dtype=float)
    a, b = table[(first, sparsity)], table[(second, sparsity)]
    gains = np.log(a) - np.log(b) if log else a - b
    return gains[np.isfinite(gains)]


def diverged_seeds(runs: pd.DataFrame, arm: str) -> set:
    """The seeds of `arm` whose run diverged: a number of it is not finite (as the tables count it)."""
    mine = runs[runs.arm == arm]
    return set(mine.loc[~np.isfinite(mine.value.astype(float)), "seed"])


def counted_gains(runs: pd.DataFrame, gains: pd.Series, first: str, second: str, *, sign: int) -> pd.Series:
    """The per-seed gains with every seed both arms ran, a diverged run counted as its arm's worst
    outcome (the rule `divergence: worst`): -inf in the claimed direction (`sign`) where `first`
    diverged, +inf where `second` did, a tie (0) where both did. `gains`: the finite gains, of the
    seeds that have every number the endpoint reads; a seed that ran without one and did not
    diverge stays out (a missing number is no outcome)."""
    ran = set(runs.loc[runs.arm == first, "seed"]) & set(runs.loc[runs.arm == second, "seed"])
    lost_first, lost_second = diverged_seeds(runs, first), diverged_seeds(runs, second)
    counted = {}
    for seed in sorted(ran):
        if seed in lost_first or seed in lost_second:
            both = seed in lost_first and seed in lost_second
            counted[seed] = 0.0 if both else sign * (math.inf if seed in lost_second else -math.inf)
        elif seed in gains.index:
            counted[seed] = gains[seed]
    return pd.Series(counted, dtype=float)


def unpaired(frame: pd.DataFrame, rows: pd.DataFrame, arms: tuple[str, str], sparsities: list[float]) -> str:
    """The arms' seeds that fall out of an endpoint's pairs, in words; '' where none did. `frame`:
    the pipeline's runs (any metric: the seeds each arm ran); `rows`: the endpoint's metric. A seed
    falls out where its number at one of `sparsities` is missing or not finite; a run whose numbers
    are not finite diverged (as the tables count it). The pairs are the seeds with both numbers:
    a reader must see what a comparison lost, and whose seeds."""
    words = []
    for arm in arms:
        ran = frame[frame.arm == arm]
        mine = rows[(rows.arm == arm) & rows.sparsity.isin(sparsities)]
        finite = mine[np.isfinite(mine.value.astype(float))].groupby("seed").sparsity.nunique()
        lost = set(ran.seed) - set(finite[finite == len(set(sparsities))].index)
        if not lost:
            continue
        diverged = set(ran.loc[~np.isfinite(ran.value.astype(float)), "seed"]) & lost
        counts = [(len(diverged), "diverged"), (len(lost - diverged), "without this number")]
        words += [f"{arm}: {n} of {ran.seed.nunique()} seeds {why}" for n, why in counts if n]
    return "; ".join(words)


def _scale(spec: dict[str, Any], metric: dict[str, Any]) -> tuple[bool, str]:
    """Whether the endpoint compares on the log scale (a ratio), and its unit: the metric's, or
    the endpoint's own `scale` with its `unit` (a unit of differences is no unit of ratios)."""
    scale = spec.get("scale", metric["scale"])
    if scale != metric["scale"] and "unit" not in spec:
        raise ValueError(f"an endpoint of {spec['metric']} on the {scale} scale states its unit (`unit:`)")
    return scale == "ratio", spec.get("unit", metric["unit"])


def _margin(spec: dict[str, Any], log: bool, sign: int) -> tuple[float, float, str]:
    """The endpoint's margin as stated (NaN: none), as tested (its log for a ratio; 0: none), and
    its words for the label. A margin lies in the claimed direction: "at least twice" is 2.0 where
    higher is better, "lower by at least 0.3" is -0.3."""
    if "margin" not in spec:
        return math.nan, 0.0, ""
    margin = float(spec["margin"])
    shift = (math.log(margin) if margin > 0 else math.nan) if log else margin
    if not sign * shift > 0:  # NaN fails too
        raise ValueError(
            f"{spec['first']} vs {spec['second']} on {spec['metric']}: margin {margin:g} lies against the claimed "
            f"direction (better is {'higher' if sign > 0 else 'lower'}: a margin {'>' if sign > 0 else '<'} {int(log)})"
        )
    text = f"×{margin:g}" if log else f"{margin:+g}"
    return margin, shift, f", {'at least' if sign > 0 else 'at most'} {text}"


def _matched(spec: dict[str, Any], log: bool) -> bool:
    """Whether the endpoint compares at matched dense quality (`matched: dense`,
    horst_sparse.analysis.matched): an `at` endpoint of a ratio's metric."""
    if "matched" not in spec:
        return False
    if spec["matched"] != "dense" or "at" not in spec or not log:
        raise ValueError(
            f"{spec['first']} vs {spec['second']} on {spec['metric']}: `matched: dense` is the only matching, "
            "for an `at` endpoint of a ratio (perplexity)"
        )
    return True


def _endpoints(
    rules: dict[str, Any], claim: dict[str, Any], frame: pd.DataFrame, everything: pd.DataFrame
) -> list[dict[str, Any]]:
    """`frame`: the final numbers; `everything`: with the curve points (the matched endpoints read them)."""
    rows = []
    for spec in claim["endpoints"]:
        metric = rules["metrics"][spec["metric"]]
        sign = 1 if metric["better"] == "higher" else -1
        log, unit = _scale(spec, metric)
        margin, shift, bound = _margin(spec, log, sign)
        cells = {k: v for k, v in rules["cells"][claim["pipeline"]].items() if k in ("method", "pattern")}
        cells |= {k: spec[k] for k in ("method", "pattern") if k in spec}
        runs = frame[frame.pipeline == claim["pipeline"]]
        rows_of_metric = _rows(frame, claim["pipeline"], spec["metric"], cells["method"], cells["pattern"])
        table = per_seed(frame, claim["pipeline"], spec["metric"], cells["method"], cells["pattern"])
        arms = (spec["first"], spec["second"])
        operator = " / " if log else " − "
        named = "" if spec["metric"] in ("top1", "ppl") else f"{metric['name']}: "  # the headline metrics go unnamed
        base = dict(
            claim=claim["id"],
            metric=spec["metric"],
            first=spec["first"],
            second=spec["second"],
            unit=unit,
            decimals=metric["decimals"],
            ratio=log,
            margin=margin,
            shift=shift,
            sign=sign,
        )
        worst = rules.get("divergence") == "worst"  # the primary test counts diverged runs (judge)
        if _matched(spec, log):
            with_dense = pd.concat([rows_of_metric, _rows(frame, claim["pipeline"], spec["metric"], "none", "dense")])
            for s in spec["at"]:
                m = matched_gains(everything, claim["pipeline"], *arms, float(s), metric=spec["metric"], **cells)
                rows.append(
                    {
                        **base,
                        "endpoint": f"{named}{spec['first']}{operator}{spec['second']} at {pct(s)}, "
                        f"matched dense perplexity{bound}",
                        "gains": m.gains,
                        **({"counted": counted_gains(runs, m.gains, *arms, sign=sign)} if worst else {}),
                        "unpaired": unpaired(runs, with_dense, arms, [0.0, float(s)]),
                        "not_comparable": m.words(*arms),
                    }
                )
        elif "at" in spec:
            for s in spec["at"]:
                gains = paired_gains(table, spec["first"], spec["second"], float(s), log=log)
                rows.append(
                    {
                        **base,
                        "endpoint": f"{named}{spec['first']}{operator}{spec['second']} at {pct(s)}{bound}",
                        "gains": gains,
                        **({"counted": counted_gains(runs, gains, *arms, sign=sign)} if worst else {}),
                        "unpaired": unpaired(runs, rows_of_metric, arms, [float(s)]),
                    }
                )
        else:
            start, ends = spec["change"]["from"], spec["change"]["to"]
            ends = ends if isinstance(ends, list) else [ends]
            before = paired_gains(table, spec["first"], spec["second"], float(start), log=log)
            candidates = {e: paired_gains(table, spec["first"], spec["second"], float(e), log=log) for e in ends}
            candidates = {e: g for e, g in candidates.items() if len(g)}
            end = max(candidates, key=lambda e: sign * candidates[e].mean()) if candidates else ends[-1]
            after = candidates.get(end, pd.Series(dtype=float))
            seeds = before.index.intersection(after.index)
            what = "ratio" if log else "gain"
            rows.append(
                {
                    **base,
                    "endpoint": f"{named}{spec['first']}{operator}{spec['second']}: {what} at {pct(end)} "
                    f"{'over' if log else 'minus'} {what} at {pct(start)}{bound}",
                    "gains": after[seeds] - before[seeds],
                    **(
                        {"counted": counted_gains(runs, after[seeds] - before[seeds], *arms, sign=sign)}
                        if worst
                        else {}
                    ),
                    "unpaired": unpaired(runs, rows_of_metric, arms, [float(start), float(end)]),
                }
            )
    return rows


def _outcome(n: int, p_holm: float, alpha: float, beyond: float) -> str:
    """`beyond`: > 0 where the mean lies beyond the margin (0 without one) in the claimed direction."""
    if n < 2 or not math.isfinite(p_holm):
        return NOT_TESTABLE
    if p_holm < alpha:
        return SUPPORTS if beyond > 0 else CONTRADICTS
    return UNDECIDED


def judge(frame: pd.DataFrame, rules: dict[str, Any]) -> pd.DataFrame:
    """One row per endpoint: its estimate, interval, p, Holm-adjusted p, outcome, detectable effect,
    and the sign-flip test's p, Holm-adjusted p and outcome (the sensitivity analysis).
    `frame` holds one study's runs of one split (the caller chooses: `rules["split"]`), their curve
    points too where they measured them: an endpoint with `matched: dense` compares the first arm's
    final pruned perplexity with the second's at the same dense perplexity, on the same seed's curve
    (horst_sparse.analysis.matched); the seeds outside that curve are not comparable (`not_comparable`).

    Under `divergence: worst` the primary test counts every seed both arms ran, a diverged run as
    its arm's worst outcome (`counted_gains`): the exact signed-rank test, the median gain and its
    order-statistic interval; the paired t-test over the seeds both arms finished stays beside it
    as the complete-case sensitivity analysis (columns `*_complete`)."""
    confidence, power = rules["confidence"], rules["power"]
    alpha = 1 - confidence
    everything, frame = frame, final_numbers(frame)
    rows = []
    for claim in rules["claims"]:
        family = _endpoints(rules, claim, frame, everything)
        gains = [e.pop("gains").to_numpy() for e in family]
        shifts = [e.pop("shift") for e in family]
        intervals = [paired_interval(g, confidence) for g in gains]  # the gains themselves, not shifted
        # A margin moves the null hypothesis, not the estimate: both tests read the gains beyond it.
        p = [paired_interval(g - shift, confidence).p for g, shift in zip(gains, shifts)]
        # The same family as the t-test's: an endpoint without two pairs has no p
        p_flip = [sign_flip_p(g - shift) if len(g) > 1 else math.nan for g, shift in zip(gains, shifts)]
        tests = zip(family, intervals, shifts, p, holm(p), p_flip, holm(p_flip))
        judged = []
        for endpoint, interval, shift, p_t, p_holm, p_sf, p_sf_holm in tests:
            beyond = np.sign(interval.mean - shift) * endpoint["sign"]
            judged.append(
                {
                    **endpoint,
                    "estimate": interval.mean,
                    "low": interval.low,
                    "high": interval.high,
                    "n": interval.n,
                    "p": p_t,
                    "p_holm": p_holm,
                    "outcome": _outcome(interval.n, p_holm, alpha, beyond),
                    "detectable": detectable_effect(interval.sd, interval.n, alpha=alpha, power=power),
                    "p_signflip": p_sf,
                    "p_signflip_holm": p_sf_holm,
                    "outcome_signflip": _outcome(interval.n, p_sf_holm, alpha, beyond),
                }
            )
        if rules.get("divergence") == "worst":
            judged = _counting_divergence(judged, shifts, alpha, confidence)
        rows += judged
    return pd.DataFrame.from_records(rows)


COMPLETE_CASE = ("estimate", "low", "high", "n", "p", "p_holm", "outcome")


def _counting_divergence(
    judged: list[dict[str, Any]], shifts: list[float], alpha: float, confidence: float
) -> list[dict[str, Any]]:
    """A claim's endpoints with the divergence-counting test as the primary one and the t-test's
    columns kept as `<column>_complete`."""
    counted = [e.pop("counted").to_numpy() for e in judged]
    p = [signed_rank_p(c - shift) if len(c) > 1 else math.nan for c, shift in zip(counted, shifts)]
    out = []
    for endpoint, c, shift, p_rank, p_holm in zip(judged, counted, shifts, p, holm(p)):
        median, low, high = median_interval(c, confidence)
        with np.errstate(invalid="ignore"):
            beyond = np.sign(np.median(c - shift)) * endpoint["sign"] if len(c) else 0.0
        complete = {f"{k}_complete": endpoint[k] for k in COMPLETE_CASE}
        primary = dict(estimate=median, low=low, high=high, n=len(c), p=p_rank, p_holm=p_holm)
        out.append(
            {
                **endpoint,
                **complete,
                **primary,
                "outcome": _outcome(len(c), p_holm, alpha, beyond),
                "test": "signed-rank",
            }
        )
    return out


def divergence_rates(frame: pd.DataFrame, rules: dict[str, Any]) -> pd.DataFrame:
    """Each claim arm's seeds, how many diverged, and the exact (Clopper-Pearson) interval of its
    divergence rate at the rules' confidence: one row per (pipeline, arm) the claims compare."""
    arms = dict.fromkeys(
        (claim["pipeline"], arm)
        for claim in rules["claims"]
        for e in claim["endpoints"]
        for arm in (e["first"], e["second"])
    )
    frame = final_numbers(frame)  # a run diverged where one of its final numbers is not finite
    rows = []
    for pipeline, arm in arms:
        runs = frame[(frame.pipeline == pipeline) & (frame.arm == arm)]
        seeds, lost = runs.seed.nunique(), len(diverged_seeds(runs, arm))
        low, high = rate_interval(lost, seeds, rules["confidence"])
        rows.append(
            dict(
                pipeline=pipeline,
                arm=arm,
                seeds=seeds,
                diverged=lost,
                rate=lost / seeds if seeds else math.nan,
                low=low,
                high=high,
            )
        )
    return pd.DataFrame.from_records(rows)


def sensitivity(judgement: pd.DataFrame) -> pd.DataFrame:
    """The endpoints whose outcome the sign-flip test judges otherwise than the t-test (which
    decides the verdicts): for the report to name. Empty where the two agree everywhere."""
    differ = judgement[judgement["outcome"] != judgement["outcome_signflip"]]
    columns = ["claim", "endpoint", "n", "p_holm", "outcome", "p_signflip_holm", "outcome_signflip"]
    return differ[columns].reset_index(drop=True)


def verdicts(judgement: pd.DataFrame, rules: dict[str, Any], *, outcome: str = "outcome") -> pd.DataFrame:
    """One row per claim: id, text, verdict; from the endpoints' `outcome` column (the stated
    test's; `outcome_signflip`: what the sensitivity analysis would conclude)."""
    rows = []
    for claim in rules["claims"]:
        outcomes = set(judgement.loc[judgement.claim == claim["id"], outcome])
        verdict = (
            NOT_TESTED
            if outcomes <= {NOT_TESTABLE}
            else NOT_REPRODUCED
            if CONTRADICTS in outcomes
            else REPRODUCED
            if outcomes == {SUPPORTS}
            else INCONCLUSIVE
        )
        rows.append({"claim": claim["id"], "text": " ".join(claim["text"].split()), "verdict": verdict})
    return pd.DataFrame.from_records(rows)
