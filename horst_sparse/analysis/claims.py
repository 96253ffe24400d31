"""The judge of the paper's claims: the one code that turns numbers into verdicts, by the rules
of `claims.yaml` (the one place they are stated; read it for what "supports" means).

    judgement = judge(frame, load_rules())       # one row per endpoint
    verdicts(judgement)                          # one row per claim
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from horst_sparse.analysis.stats import detectable_effect, holm, paired_interval

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


def per_seed(frame: pd.DataFrame, pipeline: str, metric: str, method: str, pattern: str) -> pd.DataFrame:
    """seed x (arm, sparsity) of one pipeline's metric; the log where the metric is a ratio's."""
    rows = frame[
        (frame.pipeline == pipeline) & (frame.metric == metric) & (frame.method == method) & (frame.pattern == pattern)
    ]
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


def _endpoints(rules: dict[str, Any], claim: dict[str, Any], frame: pd.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for spec in claim["endpoints"]:
        metric = rules["metrics"][spec["metric"]]
        log, sign = metric["scale"] == "ratio", 1 if metric["better"] == "higher" else -1
        cells = {k: v for k, v in rules["cells"][claim["pipeline"]].items() if k in ("method", "pattern")}
        cells |= {k: spec[k] for k in ("method", "pattern") if k in spec}
        table = per_seed(frame, claim["pipeline"], spec["metric"], cells["method"], cells["pattern"])
        operator = " / " if log else " − "
        named = "" if spec["metric"] in ("top1", "ppl") else f"{metric['name']}: "  # the headline metrics go unnamed
        base = dict(
            claim=claim["id"],
            metric=spec["metric"],
            first=spec["first"],
            second=spec["second"],
            unit=metric["unit"],
            decimals=metric["decimals"],
            ratio=log,
            sign=sign,
        )
        if "at" in spec:
            for s in spec["at"]:
                gains = paired_gains(table, spec["first"], spec["second"], float(s), log=log)
                rows.append(
                    {
                        **base,
                        "endpoint": f"{named}{spec['first']}{operator}{spec['second']} at {pct(s)}",
                        "gains": gains,
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
                    f"{'over' if log else 'minus'} {what} at {pct(start)}",
                    "gains": after[seeds] - before[seeds],
                }
            )
    return rows


def judge(frame: pd.DataFrame, rules: dict[str, Any]) -> pd.DataFrame:
    """One row per endpoint: its estimate, interval, p, Holm-adjusted p, outcome, detectable effect.
    `frame` holds one study's runs of one split (the caller chooses: `rules["split"]`)."""
    confidence, power = rules["confidence"], rules["power"]
    alpha = 1 - confidence
    rows = []
    for claim in rules["claims"]:
        family = _endpoints(rules, claim, frame)
        intervals = [paired_interval(e.pop("gains").to_numpy(), confidence) for e in family]
        adjusted = holm([i.p for i in intervals])
        for endpoint, interval, p_holm in zip(family, intervals, adjusted):
            direction = np.sign(interval.mean) * endpoint["sign"]
            if interval.n < 2 or not math.isfinite(p_holm):
                outcome = NOT_TESTABLE
            elif p_holm < alpha:
                outcome = SUPPORTS if direction > 0 else CONTRADICTS
            else:
                outcome = UNDECIDED
            rows.append(
                {
                    **endpoint,
                    "estimate": interval.mean,
                    "low": interval.low,
                    "high": interval.high,
                    "n": interval.n,
                    "p": interval.p,
                    "p_holm": p_holm,
                    "outcome": outcome,
                    "detectable": detectable_effect(interval.sd, interval.n, alpha=alpha, power=power),
                }
            )
    return pd.DataFrame.from_records(rows)


def verdicts(judgement: pd.DataFrame, rules: dict[str, Any]) -> pd.DataFrame:
    """One row per claim: id, text, verdict."""
    rows = []
    for claim in rules["claims"]:
        outcomes = set(judgement.loc[judgement.claim == claim["id"], "outcome"])
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
