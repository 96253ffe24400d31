"""What a rerun's numbers say beside a committed record's (`make check-results`, the end of `make demo`).

A CPU run's last bits follow the code paths its libraries chose on its CPU, and a run near a
stability edge amplifies them: the same seed trains on one CPU and diverges on another. So a rerun
is judged by the kind of check the record allows, and the check says which kind it was:

* **bit for bit** (`exactly`), where the record was made in the reproducible CPU mode
  (`horst_sparse.cpu_mode`, its `reproducible_cpu` column) and the rerun runs in it at the same
  thread count: every number of the rerun must equal the record's (to the record's
  SIGNIFICANT_DIGITS), a divergence included.
* **within the committed spread** (`within_spread`), where it was not (protocols v1-v6): another
  CPU's rerun of a seed is, for a chaotic run, a fresh draw from the seed-to-seed distribution, so a
  few seeds of the cell are rerun and the cell's endpoint (ENDPOINT) is tested against all its
  committed seeds: an exact two-sided rank test (a diverged run ranked worst, as tuning scores it),
  failing at p < ALPHA, with each side's divergence rate. The other numbers are shown, not tested.

Both name the machines (CPU model, torch's capability, threads, mode) of the record and of the rerun,
a diverged rerun's included. Which cell is rerun, and how: horst_sparse/study/check.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from horst_sparse.analysis.runs import read_record
from horst_sparse.analysis.tables import SIGNIFICANT_DIGITS
from horst_sparse.paths import REPO

ALPHA = 0.01  # at 10 committed seeds and 3 reruns, the smallest p is 2 / C(13, 3) = 0.007: all 3 beyond all 10
# The number a cell's spread check tests, per metric: (method, pattern) of its row, and whether higher is better
ENDPOINT = {"top1": ("acdc", "unstructured", True), "ppl": ("none", "dense", False)}
KEYS = ["metric", "method", "pattern", "sparsity"]
# A GPT-2 whose perplexity moves less than this from dense to the most pruned magnitude cell: its block
# matrices carry nothing (the model collapsed to what its embeddings and head predict alone)
COLLAPSE_SPREAD = 0.01


def as_recorded(value: float) -> float:
    """`value` as the record keeps it (write_csv's significant digits)."""
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}") if math.isfinite(value) else value


def identical(before: float, after: float) -> bool:
    """The same recorded number, or both missing (diverged)."""
    if math.isnan(before) or math.isnan(after):
        return math.isnan(before) and math.isnan(after)
    return as_recorded(before) == as_recorded(after)


def shown(value: float) -> str:
    return "diverged" if math.isnan(value) else f"{value:.6g}"


def collapsed(frame: pd.DataFrame) -> set[str]:
    """The runs whose perplexity pruning does not move (COLLAPSE_SPREAD): a collapsed model, not a
    robust one, which a comparison shows as such."""
    ppl = frame[
        (frame.metric == "ppl")
        & frame.method.isin(["none", "magnitude"])
        & frame.pattern.isin(["dense", "unstructured"])
    ]
    spread = ppl.groupby("run").value.agg(
        lambda v: v.max() / v.min() - 1 if v.notna().all() and len(v) > 1 else math.inf
    )
    return set(spread.index[spread < COLLAPSE_SPREAD])


def rank_test(committed: Sequence[float], reruns: Sequence[float], *, higher_is_better: bool) -> float:
    """Exact two-sided p of the reruns' mean rank among committed + reruns under exchangeability
    (every split of the pooled runs into two groups of these sizes equally likely). A diverged run
    (NaN) ranks worst; ties share their mean rank."""
    badness = [math.inf if math.isnan(v) else (-v if higher_is_better else v) for v in [*committed, *reruns]]
    ranks = pd.Series(badness).rank(method="average").tolist()
    k, expected = len(reruns), sum(ranks) / len(ranks)
    observed = abs(sum(ranks[len(committed) :]) / k - expected)
    splits = list(itertools.combinations(ranks, k))
    extreme = sum(abs(sum(split) / k - expected) >= observed - 1e-12 for split in splits)
    return extreme / len(splits)


def machine_text(row: Any) -> str:
    """`host vm (Intel Xeon ..., AVX512), 1 torch thread(s) a run, reproducible mode`: where a run's
    numbers were computed; 'a machine not recorded' where the run recorded none."""
    if pd.isna(getattr(row, "host", None)):
        return "a machine not recorded"
    capability = "" if pd.isna(getattr(row, "cpu_capability", None)) else f", {row.cpu_capability}"
    gpu = "" if pd.isna(getattr(row, "gpu", None)) else f", GPU {row.gpu}"
    mode = {"True": ", reproducible mode", "False": ", native mode"}.get(
        str(getattr(row, "reproducible_cpu", None)), ""
    )
    return f"host {row.host} ({row.cpu}{capability}{gpu}), {row.cpu_threads:.0f} torch thread(s) a run{mode}"


def machines(rows: pd.DataFrame) -> str:
    return "; ".join(sorted({machine_text(r) for r in rows.drop_duplicates("run").itertuples()})) or "none"


def in_reproducible_mode(rows: pd.DataFrame) -> bool:
    """Whether every run of `rows` recorded the reproducible CPU mode (a run that recorded none was not in it)."""
    return "reproducible_cpu" in rows and rows.reproducible_cpu.map(lambda v: str(v) == "True").all()


def exactly(committed: pd.DataFrame, reruns: pd.DataFrame, seeds: Sequence[int]) -> int:
    """Every number of the rerun seed identical to the record's; 1 where one is not."""
    both = committed[committed.seed == seeds[0]].merge(reruns, on=KEYS, suffixes=("_before", "_after"))
    same = [identical(b, a) for b, a in zip(both.value_before, both.value_after)]
    for row, agrees in zip(both.itertuples(), same):
        print(
            f"{row.metric} {row.method} {row.pattern} {row.sparsity:g}: committed {shown(row.value_before)}, "
            f"rerun {shown(row.value_after)}: {'identical' if agrees else 'DIFFERS'}"
        )
    verdict = all(same) and len(both) == len(committed[committed.seed == seeds[0]])
    print(
        f"{sum(same)} of {len(both)} numbers identical: "
        + ("the record reproduces bit for bit" if verdict else "the record does NOT reproduce bit for bit")
    )
    return int(not verdict)


def within_spread(committed: pd.DataFrame, reruns: pd.DataFrame, seeds: Sequence[int]) -> int:
    """The endpoint's rank test (ALPHA) and each side's divergence rate; every other number shown beside
    the committed range. 1 where the reruns fall outside the committed spread."""
    status = 0

    def every_run(frame: pd.DataFrame, key: tuple) -> list[float]:
        """The number of every run of `frame`: NaN where a run has none (a diverged run records only
        some of the numbers it would have measured), so a divergence counts in every number."""
        values = frame.set_index([*KEYS, "run"]).value
        return [values.get((*key, run), math.nan) for run in frame.run.unique()]

    for key, _ in committed.groupby(KEYS, sort=False):
        metric, method, pattern, sparsity = key
        before, after = every_run(committed, key), every_run(reruns, key)
        finite = [v for v in before if math.isfinite(v)]
        spread = f"{min(finite):.6g} to {max(finite):.6g}" if finite else "none finished"
        diverged = f"diverged {sum(map(math.isnan, before))} of {len(before)} committed, {sum(map(math.isnan, after))} of {len(after)} rerun"
        line = f"{metric} {method} {pattern} {sparsity:g}: reruns {', '.join(map(shown, after))}; committed {spread}; {diverged}"
        endpoint = ENDPOINT.get(metric)
        if endpoint is None or endpoint[:2] != (method, pattern):
            print(f"{line} (shown, not tested)")
            continue
        p = rank_test(before, after, higher_is_better=endpoint[2])
        outside = p < ALPHA
        status = max(status, int(outside))
        print(
            f"{line}; rank test p = {p:.3g}: "
            + (
                f"OUTSIDE the committed spread (p < {ALPHA})"
                if outside
                else f"within the committed spread (p >= {ALPHA})"
            )
        )
    print(
        "the record reproduces within its spread"
        if not status
        else "the record does NOT reproduce: the reruns fall outside its spread"
    )
    return status


def compare_with_reference(frame: pd.DataFrame, reference: Path) -> int:
    """make demo's last words: each top-1 and perplexity of these runs beside the committed reference's;
    both made in the reproducible CPU mode, each must be identical (a divergence included), else the
    numbers are shown and not judged. 0 when every number is identical."""
    from horst_sparse.analysis import tables

    if not reference.is_file():
        print(f"\nnothing to compare: no committed reference {reference} (make demo-reference writes one)")
        return 1
    committed = read_record([reference])
    both = committed[committed.metric.isin(ENDPOINT)].merge(frame, on=["run", *KEYS], suffixes=("_before", "_after"))
    if both.empty:
        print(f"\nnothing to compare: no run of these is in {reference}")
        return 1
    same = [identical(b, a) for b, a in zip(both.value_before, both.value_after)]
    dead = {"committed": collapsed(committed), "yours": collapsed(frame)}

    def cell(values: pd.Series, side: str) -> list[str]:
        return [shown(v) + (" (collapsed)" if run in dead[side] else "") for run, v in zip(both.run, values)]

    table = pd.DataFrame(
        {
            "run": both.run.map(lambda r: r.split("/", 2)[-1]),
            "number": [
                f"{m} {tables.column_label(me, pa, sp)}"
                for m, me, pa, sp in zip(both.metric, both.method, both.pattern, both.sparsity)
            ],
            "committed": cell(both.value_before, "committed"),
            "yours": cell(both.value_after, "yours"),
            "identical": ["yes" if s else "NO" for s in same],
        }
    )
    where = reference.relative_to(REPO) if reference.is_relative_to(REPO) else reference
    print(f"\n## Your runs beside the committed reference ({where})\n")
    print(tables.markdown(table, right=2))
    print(f"\ncommitted on: {machines(committed)}\nyours on: {machines(frame)}")
    if dead["committed"] | dead["yours"]:
        print(
            f"collapsed: {', '.join(sorted(r.split('/', 2)[-1] for r in dead['committed'] | dead['yours']))}: "
            f"pruning to the highest sparsity moves its perplexity by less than {COLLAPSE_SPREAD:.0%}, so its "
            "block matrices carry nothing (a collapsed model, not a robust one)"
        )
    if not (in_reproducible_mode(committed) and in_reproducible_mode(frame)):
        print(
            "not every run was made in the reproducible CPU mode: the numbers are shown, not judged "
            "(only that mode gives the same bits on another CPU)"
        )
        return 1
    print(
        f"{sum(same)} of {len(both)} numbers identical, bit for bit (one seed: an illustration of the pipeline, "
        "not evidence; the study's ten seeds are)"
    )
    return int(not all(same))
