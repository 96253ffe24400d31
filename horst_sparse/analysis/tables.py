"""Cells and their text: the one place a number is aggregated and the one place it is rounded.

A cell is every run of one (pipeline, data, model, arm, signature, split) at one (metric,
method, pattern, sparsity): its seeds. Shown as `mean ± sample std` (one run: its value, no
"± 0"); `n` counts the runs; a run whose number is not finite counts in `[diverged k]`. Where an
arm ran several settings (a sweep), each is a row named by the config keys that tell them apart
(`setting`: `train.epochs=6`), in the order of their values; columns go in sparsity order. The
CSV files keep SIGNIFICANT_DIGITS significant digits (`write_csv`); markdown and LaTeX round each
number to its metric's decimals, here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from horst_sparse.analysis.claims import pct
from horst_sparse.analysis.stats import spread

# What every results file keeps of a number. numpy and scipy take other SIMD paths on other CPUs
# (AVX2, AVX512, NEON) and move the 16th-17th significant digit of a mean or an interval bound;
# ten digits are far below any spread a study measures and come out the same on every CPU.
SIGNIFICANT_DIGITS = 10


def significant(values: pd.Series) -> pd.Series:
    """The numbers as a results file keeps them (SIGNIFICANT_DIGITS significant digits)."""
    return values.map(lambda v: float(f"{v:.{SIGNIFICANT_DIGITS}g}"))


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    """Every CSV of the results layer: the same rule for every number (SIGNIFICANT_DIGITS)."""
    frame.to_csv(path, index=False, float_format=f"%.{SIGNIFICANT_DIGITS}g")


CELL_KEYS = ["pipeline", "data", "model", "arm", "signature", "eval_split", "metric", "method", "pattern", "sparsity"]
DECIMALS = {"top1": 2, "ppl": 2, "weights_median_log10": 3, "weights_below_1e-3": 2}
METRIC_TITLES = {
    "top1": "top-1 accuracy (%) of the final model",
    "ppl": "perplexity after one-shot pruning (no retraining)",
}
# Claim 3's statistics of the trained weights: claims.md reports them, the tables do not.
WEIGHT_METRICS = ("weights_median_log10", "weights_below_1e-3")
ARM_ORDER = ("adamw", "ham", "horst", "horst_prunable", "horst_sm", "horst_beta0", "horst_mirror_off", "adamw_decay")


def arm_color(arm: str, arms: list[str]) -> str:
    """One colour per arm in every figure: its place in ARM_ORDER, then after them in `arms`."""
    extra = [a for a in arms if a not in ARM_ORDER]
    return f"C{ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER) + extra.index(arm)}"


def title(pipeline: str, metric: str) -> str:
    """A table's title: `vit: top-1 accuracy (%) of the final model`."""
    return f"{pipeline}: {METRIC_TITLES.get(metric, metric)}"


def number(value: float, decimals: int) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{decimals}f}"


def signed(value: float, decimals: int) -> str:
    return "–" if not math.isfinite(value) else f"{value:+.{decimals}f}"


def estimate_text(row: Any) -> str:
    """An endpoint's or a comparison's estimate and interval: `+1.02 [+0.55, +1.49]`,
    `×0.912 [0.884, 0.941]`; one pair: `+1.02 (n=1, no interval)`."""
    d = row.decimals
    if row.ratio:
        mean, bounds = f"×{math.exp(row.estimate):.{d}f}", f"[{_ratio_bound(row.low, d)}, {_ratio_bound(row.high, d)}]"
    else:
        mean, bounds = signed(row.estimate, d), f"[{_bound(row.low, d)}, {_bound(row.high, d)}]"
    if not math.isfinite(row.estimate):
        return "no pair"
    return f"{mean} {bounds}" if row.n > 1 else f"{mean} (n={row.n}, no interval)"


def _bound(value: float, decimals: int) -> str:
    """An interval's bound; an infinite one (a rank interval reaching a diverged run) as ∞."""
    return ("∞" if value > 0 else "-∞") if math.isinf(value) else signed(value, decimals)


def _ratio_bound(log_value: float, decimals: int) -> str:
    return ("∞" if log_value > 0 else "0") if math.isinf(log_value) else f"{math.exp(log_value):.{decimals}f}"


def p_text(p: float) -> str:
    return "–" if not math.isfinite(p) else "< 0.001" if p < 0.001 else f"{p:.3f}"


def column_label(method: str, pattern: str, sparsity: float) -> str:
    """`90 %`, `dense`, `wanda 50 %`, `magnitude 2:4`: the paper's protocol (AC/DC, magnitude
    unstructured) by its sparsity alone."""
    if (
        pattern == "dense"
        or method in ("acdc",)
        and pattern == "unstructured"
        or (method, pattern) == ("magnitude", "unstructured")
    ):
        return pct(sparsity)
    return f"{method} {pct(sparsity) if pattern == 'unstructured' else pattern}"


SETTING_GROUP = ["pipeline", "data", "model", "arm"]  # the rows of a table an arm's settings tell apart


def value_text(value: Any) -> str:
    """A config value as a setting shows it: `6`, `0.001`, `true`, `[0.5,0.9]`, `null`."""
    if isinstance(value, tuple):
        return "[" + ",".join(map(value_text, value)) + "]"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "null"
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value)).lower()
    if isinstance(value, (float, np.floating)):  # the shortest text that is this number; 6.0 (beside a NaN) as 6
        text = repr(float(value))
        return text.removesuffix(".0")
    return str(value)


def value_key(value: Any) -> tuple:
    """Settings sort by their values: numbers as numbers, then the others as text."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return (2, value_text(value))
    return (0, float(value)) if math.isfinite(value) else (1, 0.0)


def settings(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (pipeline, data, model, arm, signature): `setting`, the config keys (the
    frame's `config.*` columns) whose values tell the arm's settings apart (`train.epochs=6`,
    `optimizer.alpha=3, optimizer.beta=0.1`; '' where the arm ran one), and `setting_rank`, its
    place in the order of those values. A record row (no config columns) is `settings <signature>`."""
    config = [c for c in frame.columns if c.startswith("config.")]
    rows = []
    for keys, group in frame.drop_duplicates([*SETTING_GROUP, "signature"]).groupby(
        SETTING_GROUP, sort=False, dropna=False
    ):
        recorded = group[group[config].notna().any(axis=1)] if config else group.iloc[:0]
        differ = [c for c in config if recorded[c].map(value_text).nunique() > 1]
        labels = []
        for values in group.to_dict("records"):
            if len(group) == 1:
                labels.append(("", ()))
            elif values["signature"] not in set(recorded["signature"]) or not differ:
                labels.append((f"settings {values['signature']}", (3, values["signature"])))
            else:
                text = ", ".join(f"{c.removeprefix('config.')}={value_text(values[c])}" for c in differ)
                labels.append((text, tuple(value_key(values[c]) for c in differ)))
        ranks = {text: rank for rank, (text, _) in enumerate(sorted(labels, key=lambda t: t[1]))}
        rows += [
            dict(zip(SETTING_GROUP, keys), signature=sig, setting=text, setting_rank=ranks[text])
            for sig, (text, _) in zip(group["signature"], labels)
        ]
    return pd.DataFrame(rows, columns=[*SETTING_GROUP, "signature", "setting", "setting_rank"])


def cells(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: mean, std, n, diverged, seeds, runs; and `setting` after `signature`
    where an arm ran several settings."""
    grouped = frame.groupby(CELL_KEYS, sort=False, dropna=False)
    # Joined on the cell keys, not placed by position: unstack() sorts the cells, apply() does not.
    stats = (
        grouped["value"]
        .apply(spread)
        .unstack()
        .join(grouped.agg(seeds=("seed", lambda s: ";".join(map(str, sorted(s)))), runs=("run", ";".join)))
        .reset_index()
    )
    stats[["n", "diverged"]] = stats[["n", "diverged"]].astype(int)
    if stats.groupby(SETTING_GROUP, dropna=False)["signature"].nunique().max() > 1:
        named = settings(frame).rename(columns={"setting_rank": "_setting"})
        stats = stats.merge(named, on=[*SETTING_GROUP, "signature"], how="left")
        columns = list(stats.columns.drop(["setting", "_setting"]))
        at = columns.index("signature") + 1
        stats = stats[columns[:at] + ["setting"] + columns[at:] + ["_setting"]]
        return order(stats).drop(columns="_setting")
    return order(stats)


def _column_rank(frame: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """A column's place: the dense model, then each method's unstructured sparsities, then its patterns."""
    method = frame["method"].map({"none": 0, "acdc": 1, "magnitude": 1, "wanda": 2}).fillna(3)
    return method, frame["pattern"] != "unstructured"


def order(frame: pd.DataFrame) -> pd.DataFrame:
    rank = frame["arm"].map(lambda a: ARM_ORDER.index(a) if a in ARM_ORDER else len(ARM_ORDER))
    method, dense = _column_rank(frame)
    settings = ["_setting"] if "_setting" in frame else []  # an arm's settings in the order of their values
    return (
        frame.assign(_rank=rank, _method=method, _dense=dense)
        .sort_values(
            ["pipeline", "data", "model", "_rank", "arm", *settings, "signature", "_method", "_dense", "sparsity"],
            kind="stable",
        )
        .drop(columns=["_rank", "_method", "_dense"])
        .reset_index(drop=True)
    )


def cell_text(row: Any, decimals: int, pm: str = "±") -> str:
    text = (
        "–"
        if row.n == 0
        else number(row.mean, decimals)
        if row.n == 1
        else f"{number(row.mean, decimals)} {pm} {number(row.std, decimals)}"
    )
    return text + (f" [diverged {row.diverged}]" if row.diverged else "")


def wide(table: pd.DataFrame, *, pm: str = "±") -> pd.DataFrame:
    """One metric's cells as rows (data, model, arm[, setting]) x columns in sparsity order, then `n`."""
    decimals = DECIMALS.get(table["metric"].iloc[0], 2)
    method, dense = _column_rank(table)
    table = table.assign(
        column=[column_label(*k) for k in zip(table.method, table.pattern, table.sparsity)],
        text=[cell_text(r, decimals, pm) for r in table.itertuples()],
        _method=method,
        _dense=dense,
    )
    several = table.groupby(["data", "model", "arm"])["signature"].nunique().max() > 1
    label = "setting" if "setting" in table else "signature"
    index = ["data", "model", "arm"] + ([label] if several else [])
    columns = list(dict.fromkeys(table.sort_values(["_method", "_dense", "sparsity"], kind="stable")["column"]))
    rows = list(dict.fromkeys(map(tuple, table[index].itertuples(index=False))))
    text = table.pivot_table(index=index, columns="column", values="text", aggfunc="first").reindex(rows)[columns]
    counts = table.pivot_table(index=index, columns="column", values="n", aggfunc="first").reindex(rows)[columns]
    text["n"] = [",".join(str(int(n)) for n in dict.fromkeys(r.dropna())) for _, r in counts.iterrows()]
    return text.fillna("–").reset_index().rename(columns={"signature": "setting"})


def label_columns(wide: pd.DataFrame) -> int:
    """How many of `wide`'s first columns are labels, not numbers."""
    return len([c for c in wide.columns if c in ("data", "model", "arm", "setting")])


def markdown(frame: pd.DataFrame, right: int | None = None) -> str:
    """A pipe table; the last `right` columns right-aligned (default: all but the first)."""
    right = len(frame.columns) - 1 if right is None else right
    left = len(frame.columns) - right
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "|".join(["---"] * left + ["---:"] * right) + "|"]
    lines += [
        "| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in frame.itertuples(index=False)
    ]
    return "\n".join(lines) + "\n"


def latex(frame: pd.DataFrame, *, caption: str, label: str, right: int) -> str:
    """A booktabs table (\\usepackage{booktabs}) by pandas."""
    frame = frame.rename(columns=lambda c: str(c).replace("%", r"\%"))
    text = frame.map(lambda v: str(v).replace("%", r"\%").replace("_", r"\_").replace("±", r"$\pm$")).to_latex(
        index=False,
        escape=False,
        column_format="l" * (len(frame.columns) - right) + "r" * right,
        caption=caption.replace("%", r"\%"),
        label=label,
        position="t",
    )
    return text.replace("\\begin{table}[t]\n", "\\begin{table}[t]\n\\centering\n", 1)
