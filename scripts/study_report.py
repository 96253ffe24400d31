"""The embedded study's statistics: paired differences over seeds, the one-shot pruner table,
and the paper's claims judged at this scale.

    python scripts/study_report.py outputs/embedded --out results/embedded

Reads the run folders `scripts/embedded_study.py` lays out,

    <runs>/vit/<variant>/s<sparsity>/seed<k>/     ViT on 8x8 digits under AC/DC at that sparsity
    <runs>/gpt2/<variant>/seed<k>/                GPT-2 on pydoc text, pruned one-shot after training

with the variants `adamw`, `ham`, `horst` (order "ms", the paper's), `horst_sm` (order "sm",
the paper's ablation), two ablations of HORST: `vit/horst_reset`
(`acdc.reset_second_moment=true`) and `gpt2/horst_prunable`
(`optimizer.hyperbolic_params=prunable`), and the control `adamw_decay` (AdamW with HORST's
weight decay + beta as its weight decay: as much shrinkage per step as HORST). A folder's variant is checked against the config its
run recorded; a mismatch is excluded and listed, never averaged in under the wrong name.

Why paired: every variant runs the same seeds (data order, initialisation), so the seed-to-seed
spread, which on these tiny benchmarks is as large as the effects, cancels in the per-seed
difference. A comparison uses only the seeds present in both members (a seed missing from one
is skipped and counted); its interval is the 95 % Student t-interval of the mean per-seed
difference. ViT: differences of top-1 in points. GPT-2: differences of perplexity and, the
primary statistic since perplexity is multiplicative (a pruned model's perplexity grows by
factors), the ratio of perplexities: exp of the mean per-seed difference of log-perplexity,
with the interval transformed the same way. One pair has no interval ("n=1, no interval"),
never "± 0".

Written into `--out`, beside what `scripts/make_tables.py` writes there (tables.md, the CSV
and LaTeX tables, accuracy_vs_sparsity.png, perplexity_vs_sparsity.png,
weight_distribution.png):

* `paired.md`, `paired.csv`: the comparisons of `COMPARISONS` at every ViT sparsity and every
  GPT-2 magnitude-unstructured sparsity (dense included), the ablations against their base,
  Wanda against magnitude pruning per GPT-2 variant; the run folders left out, with why;
* `pruners.md`, `pruners.csv`: GPT-2 perplexity per variant after magnitude and Wanda pruning,
  unstructured 50 % and 2:4, and Wanda against magnitude, paired;
* `claims.md`: each claim of results/paper/claims.md, reproduced, not reproduced or
  inconclusive at this scale, with the statistic that decides it and the rules used.

`write_report` returns these files' markdown, then tables.md's, as one document.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tables  # noqa: E402
from make_tables import NoRunsError, Run, _markdown_frame, _pct, is_paper_row, weight_histogram  # noqa: E402

CONFIDENCE = 0.95
PERCENT = f"{100 * CONFIDENCE:g} %"
COMPARISONS = (("horst", "adamw"), ("horst", "ham"), ("ham", "adamw"), ("horst_sm", "adamw"), ("horst", "horst_sm"))
# (first, second) at the cells both ran: each ablation against its base; the decay-matched AdamW
# (embedded_study.ABLATIONS) against AdamW, and HORST against it.
ABLATIONS = {
    "vit": (("horst_reset", "horst"), ("adamw_decay", "adamw"), ("horst", "adamw_decay")),
    "gpt2": (("horst_prunable", "horst"), ("adamw_decay", "adamw"), ("horst", "adamw_decay")),
}
VARIANT_ORDER = ("adamw", "ham", "horst", "horst_sm", "horst_reset", "horst_prunable", "adamw_decay")
# What each variant's runs must have recorded (flattened config keys; a key the run does not
# record is not checked).
VARIANT_CONFIG = {
    "adamw": {"optimizer.name": "adamw"},
    "ham": {"optimizer.name": "ham"},
    "horst": {"optimizer.name": "horst", "optimizer.order": "ms", "acdc.reset_second_moment": False,
              "optimizer.hyperbolic_params": "all_2d"},
    "horst_sm": {"optimizer.name": "horst", "optimizer.order": "sm"},
    "horst_reset": {"optimizer.name": "horst", "optimizer.order": "ms", "acdc.reset_second_moment": True},
    "horst_prunable": {"optimizer.name": "horst", "optimizer.order": "ms", "optimizer.hyperbolic_params": "prunable"},
    "adamw_decay": {"optimizer.name": "adamw"},
}  # fmt: skip
PRUNER_COLUMNS = (("magnitude", "unstructured", 0.5), ("wanda", "unstructured", 0.5),
                  ("magnitude", "2:4", 0.5), ("wanda", "2:4", 0.5))  # fmt: skip
SMALL_WEIGHT = 1e-3  # claim 3: the fraction of prunable weights with |w| below this
PAPER_GRID = (0.7, 0.8, 0.9)  # claim 1's sparsities
CLAIM_1_PEAK = (0.8, 0.9)  # where claim 1 puts the largest gain

# The paper's claims, as results/paper/claims.md words them.
CLAIMS = (
    "DeiT, ImageNet, AC/DC: HORST-AdamW beats AdamW at 70, 80 and 90 % sparsity; the gain is largest at 80-90 %.",
    "GPT-2 Small, SlimPajama-6B, one-shot layerwise unstructured magnitude pruning: HORST has lower validation "
    "perplexity after pruning than AdamW and HAM; the gap widens with sparsity.",
    "HORST's weights are sharply concentrated around zero; AdamW's are broad, near-Gaussian.",
)
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTED = (
    "reproduced", "not reproduced", "inconclusive at this scale", "not tested (no runs)")  # fmt: skip
BETTER, WORSE, UNDECIDED = "better", "worse", "inconclusive"  # a comparison's verdict for the first-named


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Interval:
    """Mean of per-seed differences and its t-interval (NaN bounds for fewer than 2 pairs)."""

    mean: float
    low: float
    high: float
    n: int


def t_interval(differences: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Student's t: with 5 seeds the sample std is itself uncertain, and a normal interval
    would be about 1.4 times too narrow."""
    d = np.asarray(differences, dtype=float)
    if len(d) < 2:
        return Interval(float(d.mean()) if len(d) else math.nan, math.nan, math.nan, len(d))
    half = stats.t.ppf((1 + confidence) / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return Interval(float(d.mean()), float(d.mean() - half), float(d.mean() + half), len(d))


def direction(interval: Interval, *, higher_is_better: bool) -> str:
    """`better` / `worse` for the first-named member where the interval excludes 0, else
    `inconclusive` (always with fewer than 2 pairs: there is no interval)."""
    if interval.n < 2 or interval.low <= 0 <= interval.high:
        return UNDECIDED
    return BETTER if (interval.low > 0) == higher_is_better else WORSE


@dataclass
class Paired:
    """Two series of one metric over seeds, compared seed by seed (first − second)."""

    difference: Interval  # ViT: top-1 points; GPT-2: perplexity
    log_ratio: Interval | None  # GPT-2: log(first / second), the primary statistic
    higher_is_better: bool
    seeds: list[Any]
    unpaired: list[str]  # why each seed of either member is not a pair

    @property
    def primary(self) -> Interval:
        return self.log_ratio if self.log_ratio is not None else self.difference

    @property
    def verdict(self) -> str:
        return direction(self.primary, higher_is_better=self.higher_is_better)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def pair(first: dict[Any, float], second: dict[Any, float], names: tuple[str, str]) -> tuple[list[Any], list[str]]:
    """The seeds with a finite value in both, and why each other seed is skipped."""
    seeds, unpaired = [], []
    for seed in sorted(set(first) | set(second), key=str):
        missing = [n for n, values in zip(names, (first, second)) if seed not in values]
        bad = [n for n, values in zip(names, (first, second)) if seed in values and not _finite(values[seed])]
        if missing:
            unpaired.append(f"seed {seed}: no {' or '.join(missing)} run")
        elif bad:
            unpaired.append(f"seed {seed}: {' and '.join(bad)} not finite")
        else:
            seeds.append(seed)
    return seeds, unpaired


def compare(first: dict[Any, float], second: dict[Any, float], names: tuple[str, str], *, log: bool) -> Paired:
    """`log`: perplexities (lower is better; the ratio is primary); else accuracies (higher is better)."""
    seeds, unpaired = pair(first, second, names)
    difference = t_interval([first[s] - second[s] for s in seeds])
    log_ratio = t_interval([math.log(first[s]) - math.log(second[s]) for s in seeds]) if log else None
    return Paired(difference, log_ratio, not log, seeds, unpaired)


def gap_change(gaps_from: dict[Any, float], gaps_to: dict[Any, float]) -> Interval:
    """How a per-seed gap between two variants changes from one sparsity to another, paired
    over the seeds that have it at both."""
    seeds = sorted(set(gaps_from) & set(gaps_to), key=str)
    return t_interval([gaps_to[s] - gaps_from[s] for s in seeds])


# ------------------------------------------------------------------------ text of numbers


def signed(value: float, decimals: int) -> str:
    return f"{value:+.{decimals}f}"


def mean_text(interval: Interval, decimals: int, *, ratio: bool = False) -> str:
    """`+1.02`; a ratio (the interval is of log ratios) `×0.912`."""
    return f"×{math.exp(interval.mean):.{decimals}f}" if ratio else signed(interval.mean, decimals)


def bounds_text(interval: Interval, decimals: int, *, ratio: bool = False) -> str:
    """`[+0.55, +1.49]`, a ratio's `[0.884, 0.941]`; one pair: `n=1, no interval`."""
    if interval.n < 2:
        return f"n={interval.n}, no interval"
    if ratio:
        return f"[{math.exp(interval.low):.{decimals}f}, {math.exp(interval.high):.{decimals}f}]"
    return f"[{signed(interval.low, decimals)}, {signed(interval.high, decimals)}]"


def interval_text(interval: Interval, decimals: int, *, ratio: bool = False) -> str:
    """`+1.02 [+0.55, +1.49]`, `×0.912 [0.884, 0.941]`, `+1.02 (n=1, no interval)`."""
    bounds = bounds_text(interval, decimals, ratio=ratio)
    return f"{mean_text(interval, decimals, ratio=ratio)} " + (bounds if interval.n > 1 else f"({bounds})")


def stated(interval: Interval, decimals: int, unit: str = "", *, ratio: bool = False) -> str:
    """A decisive statistic with its n: `+1.02 [+0.55, +1.49] top-1 points, n=5`, `×0.912
    [0.884, 0.941], n=5`; one pair: `+1.02 top-1 points (n=1, no interval)`."""
    unit = f" {unit}" if unit else ""
    if interval.n < 2:
        return f"{mean_text(interval, decimals, ratio=ratio)}{unit} ({bounds_text(interval, decimals)})"
    return f"{interval_text(interval, decimals, ratio=ratio)}{unit}, n={interval.n}"


def paired_text(paired: Paired) -> str:
    """The comparison's primary statistic: a ViT's top-1 difference, GPT-2's perplexity ratio."""
    if paired.log_ratio is not None:
        return "ppl ratio " + stated(paired.log_ratio, 3, ratio=True)
    return stated(paired.difference, 2, "top-1 points")


def spread_text(values: Sequence[float]) -> str:
    """`123.45 ± 6.78 [5]`, `123.45 [1]`, `–`."""
    finite = [v for v in values if _finite(v)]
    if not finite:
        return "–"
    if len(finite) == 1:
        return f"{finite[0]:.2f} [1]"
    return f"{np.mean(finite):.2f} ± {np.std(finite, ddof=1):.2f} [{len(finite)}]"


def _csv_float(value: float) -> str:
    return repr(float(value)) if math.isfinite(value) else ""


# ------------------------------------------------------------------------------ the runs


@dataclass(frozen=True)
class Cell:
    """What one number of a run measures: ViT `("acdc", pattern, sparsity)`; GPT-2 a one-shot
    result `(method, pattern, sparsity)`, the dense model `("none", "dense", 0.0)`."""

    method: str
    pattern: str
    sparsity: float

    @property
    def label(self) -> str:
        if self.pattern == "dense":
            return "0 % (dense)"
        if self.method == "acdc" or (self.method == "magnitude" and self.pattern == "unstructured"):
            return _pct(self.sparsity)
        return f"{self.method} {self.pattern if self.pattern != 'unstructured' else _pct(self.sparsity)}"


@dataclass
class Study:
    """The values of one runs folder by (pipeline, variant, cell) and seed, the runs by
    (pipeline, variant, ViT sparsity) and seed, and every folder left out."""

    runs_dir: Path
    values: dict[tuple[str, str, Cell], dict[Any, float]] = field(default_factory=dict)
    runs: dict[tuple[str, str, float | None], dict[Any, Run]] = field(default_factory=dict)  # (.., ViT sparsity)
    left_out: list[str] = field(default_factory=list)  # `folder: why`
    data: dict[str, set[str]] = field(default_factory=dict)  # pipeline -> data set names

    def series(self, pipeline: str, variant: str, cell: Cell) -> dict[Any, float]:
        return self.values.get((pipeline, variant, cell), {})

    def variants(self, pipeline: str) -> list[str]:
        present = {v for p, v, _ in self.values if p == pipeline}
        return sorted(present, key=lambda v: (VARIANT_ORDER.index(v) if v in VARIANT_ORDER else len(VARIANT_ORDER), v))

    def cells(self, pipeline: str, variants: Sequence[str] | None = None) -> list[Cell]:
        found = {c for p, v, c in self.values if p == pipeline and (variants is None or v in variants)}
        return sorted(found, key=lambda c: (c.sparsity, c.method, c.pattern))

    def folder(self, run: Run) -> str:
        return make_tables._relative(run.folder, self.runs_dir)


def _cells(run: Run) -> list[tuple[Cell, float]]:
    s = run.summary
    if run.pipeline == "vit":
        top1 = s.get("top1")
        cell = Cell("acdc", s.get("acdc", {}).get("pattern", "unstructured"), float(s["target_sparsity"]))
        return [(cell, math.nan if top1 is None else 100.0 * top1)]
    return [(_gpt2_cell(r), math.nan if r.get("ppl") is None else float(r["ppl"])) for r in s["pruning"]["results"]]


def _gpt2_cell(result: dict) -> Cell:
    """Runs from before `prune.methods` record no method or pattern: magnitude, unstructured,
    and their 0 % row is the dense model."""
    if float(result["sparsity"]) == 0.0:
        return Cell("none", "dense", 0.0)
    return Cell(result.get("method", "magnitude"), result.get("pattern", "unstructured"), float(result["sparsity"]))


def _variant(run: Run, runs_dir: Path) -> tuple[str | None, str]:
    """The run's variant from its folder, or None and why it is not one of the study's runs."""
    parts = run.folder.resolve().relative_to(runs_dir.resolve()).parts
    if len(parts) < 3 or parts[0] != run.pipeline:
        return None, f"not in the study's layout (<runs>/{run.pipeline}/<variant>/...seed<k>)"
    variant = parts[1]
    wrong = [f"{k}={make_tables._fmt(run.signature[k])} (a {variant} run has {make_tables._fmt(v)})"
             for k, v in VARIANT_CONFIG.get(variant, {}).items() if k in run.signature and run.signature[k] != v]  # fmt: skip
    if wrong:
        return None, f"its config does not match the folder's variant: {', '.join(wrong)}"
    return variant, ""


def load(runs_dir: Path, folders: Sequence[Path] | None = None) -> Study:
    """Every run folder below `runs_dir` (or only below those of `folders` that exist): finished
    runs into the study; failed, unfinished, misplaced runs and seeds run twice into `left_out`."""
    found = make_tables.scan(_existing(runs_dir, folders))
    study = Study(runs_dir)
    for run in found.failed:
        reason = str(run.summary.get("reason") or "").splitlines()
        study.left_out.append(f"{study.folder(run)}: failed (exit code {run.summary.get('exit_code')}"
                              + (f": {reason[0]}" if reason else "") + ")")  # fmt: skip
    for folder, why in found.skipped:
        study.left_out.append(f"{make_tables._relative(folder, runs_dir)}: {why}")
    placed: dict[tuple[str, str, float | None, Any], list[Run]] = {}  # (pipeline, variant, ViT sparsity, seed)
    for run in found.runs:
        variant, why = _variant(run, runs_dir)
        if variant is None:
            study.left_out.append(f"{study.folder(run)}: {why}")
        else:
            placed.setdefault((run.pipeline, variant, run.summary.get("target_sparsity"), run.seed), []).append(run)
    for (pipeline, variant, sparsity, seed), runs in placed.items():
        if len(runs) > 1:  # which one to believe is not ours to guess
            where = f" at {_pct(sparsity)}" if sparsity is not None else ""
            study.left_out.append(f"{', '.join(study.folder(r) for r in runs)}: {len(runs)} runs of {pipeline} "
                                  f"{variant}{where} with seed {seed}; none used")  # fmt: skip
            continue
        study.data.setdefault(pipeline, set()).add(make_tables.data_name(runs[0]))
        study.runs.setdefault((pipeline, variant, sparsity), {})[seed] = runs[0]
        for cell, value in _cells(runs[0]):
            study.values.setdefault((pipeline, variant, cell), {})[seed] = value
    study.left_out = sorted(set(study.left_out))
    return study


# ------------------------------------------------------------------------ paired tables


@dataclass
class Row:
    """One paired comparison, for paired.md / paired.csv."""

    pipeline: str
    kind: str  # optimizers | ablation | pruners
    first: tuple[str, Cell]  # (variant, cell)
    second: tuple[str, Cell]
    paired: Paired

    @property
    def name(self) -> str:
        (v1, c1), (v2, c2) = self.first, self.second
        if self.kind == "pruners":
            return f"{v1}: {c1.method} vs {c2.method}"
        return f"{v1} vs {v2}" + (" (ablation)" if self.kind == "ablation" else "")


def optimizer_rows(study: Study) -> tuple[list[Row], list[str]]:
    """COMPARISONS at every cell either member ran (GPT-2: the magnitude-unstructured cells and
    the dense model), the ablations at every cell the ablation ran; and the comparisons with
    no pair, with why."""
    rows, unpaired_cells = [], {}  # (pipeline, first, second, why) -> cell labels
    for pipeline in ("vit", "gpt2"):
        plans = [(a, b, "optimizers", study.cells(pipeline, (a, b))) for a, b in COMPARISONS]
        plans += [(a, b, "ablation", [c for c in study.cells(pipeline, (a,)) if c in study.cells(pipeline, (b,))])
                  for a, b in ABLATIONS[pipeline]]  # fmt: skip
        for first, second, kind, cells in plans:
            for cell in cells:
                if pipeline == "gpt2" and not is_paper_row({"method": cell.method, "pattern": cell.pattern}):
                    continue
                paired = compare(study.series(pipeline, first, cell), study.series(pipeline, second, cell),
                                 (first, second), log=pipeline == "gpt2")  # fmt: skip
                if paired.seeds:
                    rows.append(Row(pipeline, kind, (first, cell), (second, cell), paired))
                else:
                    absent = [v for v in (first, second) if not study.series(pipeline, v, cell)]
                    why = f"no {' or '.join(absent)} runs" if absent else "; ".join(paired.unpaired)
                    unpaired_cells.setdefault((pipeline, first, second, why), []).append(cell.label)
    not_compared = [f"{pipeline} {first} vs {second} at {', '.join(labels)}: {why}"
                    for (pipeline, first, second, why), labels in unpaired_cells.items()]  # fmt: skip
    return rows, not_compared


def pruner_rows(study: Study) -> list[Row]:
    """Wanda against magnitude pruning per GPT-2 variant, unstructured 50 % and 2:4."""
    rows = []
    for variant in study.variants("gpt2"):
        for pattern in ("unstructured", "2:4"):
            magnitude, wanda = Cell("magnitude", pattern, 0.5), Cell("wanda", pattern, 0.5)
            paired = compare(study.series("gpt2", variant, wanda), study.series("gpt2", variant, magnitude),
                             ("wanda", "magnitude"), log=True)  # fmt: skip
            if paired.seeds:
                rows.append(Row("gpt2", "pruners", (variant, wanda), (variant, magnitude), paired))
    return rows


def rows_frame(rows: Sequence[Row]) -> pd.DataFrame:
    records = []
    for row in rows:
        (v1, c1), (v2, c2), p = row.first, row.second, row.paired
        ratio = p.log_ratio or Interval(math.nan, math.nan, math.nan, p.difference.n)
        records.append({
            "pipeline": row.pipeline, "kind": row.kind, "first_variant": v1, "second_variant": v2,
            "first_method": c1.method, "second_method": c2.method, "pattern": c1.pattern, "sparsity": c1.sparsity,
            "difference_unit": "perplexity" if p.log_ratio is not None else "top-1 points",
            "mean_difference": _csv_float(p.difference.mean), "ci_low": _csv_float(p.difference.low),
            "ci_high": _csv_float(p.difference.high), "ratio": _csv_float(math.exp(ratio.mean)),
            "ratio_ci_low": _csv_float(math.exp(ratio.low)), "ratio_ci_high": _csv_float(math.exp(ratio.high)),
            "n_pairs": p.difference.n, "verdict": p.verdict, "seeds": ";".join(map(str, p.seeds)),
            "unpaired": len(p.unpaired), "unpaired_why": "; ".join(p.unpaired),
        })  # fmt: skip
    return pd.DataFrame.from_records(records)


def _table(rows: Sequence[Row], *, ratio: bool) -> list[str]:
    if ratio:
        header = ["comparison", "sparsity", "ppl ratio", f"{PERCENT} CI", "ppl difference", f"{PERCENT} CI", "n pairs",
                  "verdict", "unpaired"]  # fmt: skip
        lines = [[r.name, r.first[1].label, mean_text(r.paired.log_ratio, 3, ratio=True),
                  bounds_text(r.paired.log_ratio, 3, ratio=True), signed(r.paired.difference.mean, 2),
                  bounds_text(r.paired.difference, 2), r.paired.difference.n, r.paired.verdict, len(r.paired.unpaired)]
                 for r in rows]  # fmt: skip
    else:
        header = ["comparison", "sparsity", "difference (top-1 points)", f"{PERCENT} CI", "n pairs", "verdict", "unpaired"]
        lines = [[r.name, r.first[1].label, signed(r.paired.difference.mean, 2), bounds_text(r.paired.difference, 2),
                  r.paired.difference.n, r.paired.verdict, len(r.paired.unpaired)] for r in rows]  # fmt: skip
    frame = pd.DataFrame(lines, columns=header)
    return _markdown_frame(frame, 0)


def _data(study: Study, pipeline: str) -> str:
    return ", ".join(sorted(study.data.get(pipeline, ()))) or "no runs"


def paired_markdown(study: Study, rows: Sequence[Row], not_compared: Sequence[str]) -> str:
    lines = [
        "## Paired differences over seeds",
        "",
        f"Each row: first − second, seed by seed, over the seeds both ran; the mean and its {PERCENT} "
        "Student t-interval; verdict for the first-named: `better` where the interval excludes 0 in its favour "
        "(higher top-1, lower perplexity), `worse` where it excludes 0 against it, `inconclusive` otherwise "
        "(always with one pair: no interval). `unpaired`: seeds run by only one of the two, skipped (listed below).",
    ]
    vit = [r for r in rows if r.pipeline == "vit"]
    gpt2 = [r for r in rows if r.pipeline == "gpt2"]
    if vit:
        lines += ["", f"### ViT under AC/DC ({_data(study, 'vit')}): top-1 of the final sparse model", "",
                  *_table(vit, ratio=False)]  # fmt: skip
    if gpt2:
        lines += ["", f"### GPT-2 ({_data(study, 'gpt2')}): validation perplexity after one-shot layerwise magnitude "
                  "pruning", "", "Primary: the ratio of perplexities, exp of the mean per-seed log ratio (first / "
                  "second; below 1: the first is better), its interval likewise; the verdict is the ratio's.", "",
                  *_table(gpt2, ratio=True)]  # fmt: skip
    skipped = [f"{r.pipeline} {r.name} at {r.first[1].label}: {u}" for r in rows for u in r.paired.unpaired]
    if skipped or not_compared:
        lines += ["", f"### Skipped pairs ({len(skipped)}) and comparisons without a pair ({len(not_compared)})", ""]
        lines += [f"- {s}" for s in skipped] + [f"- not compared: {s}" for s in not_compared]
    lines += ["", f"### Run folders not in the statistics ({len(study.left_out)})", ""]
    lines += [f"- {s}" for s in study.left_out] or ["- none: every run folder finished and is used"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- pruners


def pruners_frame(study: Study) -> pd.DataFrame:
    records = []
    for variant in study.variants("gpt2"):
        for method, pattern, sparsity in PRUNER_COLUMNS:
            values = study.series("gpt2", variant, Cell(method, pattern, sparsity))
            finite = [values[s] for s in sorted(values, key=str) if _finite(values[s])]
            records.append({
                "variant": variant, "method": method, "pattern": pattern, "sparsity": sparsity,
                "mean": _csv_float(np.mean(finite)) if finite else "",
                "std": _csv_float(np.std(finite, ddof=1)) if len(finite) > 1 else "", "n": len(finite),
                "not_finite": len(values) - len(finite), "seeds": ";".join(map(str, sorted(values, key=str))),
                "text": spread_text(finite),
            })  # fmt: skip
    return pd.DataFrame.from_records(records)


def _wanda_finding(paired: Paired | None, where: str) -> tuple[str, str | None]:
    """(words, direction) for AdamW's Wanda-vs-magnitude at one pattern."""
    if paired is None:
        return f"no Wanda and magnitude runs of one seed at {where}", None
    verdict = paired.verdict
    stat = paired_text(paired)
    if verdict == BETTER:
        return f"lower perplexity than magnitude at {where} ({stat})", verdict
    if verdict == WORSE:
        return f"higher perplexity than magnitude at {where} ({stat})", verdict
    if paired.primary.n < 2:
        lower = "lower" if paired.primary.mean < 0 else "not lower"
        return f"{lower} perplexity than magnitude at {where} in its one seed ({stat})", verdict
    return f"no clear difference from magnitude at {where} (the interval includes 1: {stat})", verdict


def wanda_sentence(rows: Sequence[Row]) -> str:
    """Whether Wanda beat magnitude pruning for AdamW at 50 % and at 2:4 (the usual finding), from the numbers."""
    adamw = {r.first[1].pattern: r.paired for r in rows if r.first[0] == "adamw"}
    findings = [_wanda_finding(adamw.get(pattern), where) for pattern, where in (("unstructured", "50 %"), ("2:4", "2:4"))]
    usual = [where for (_, d), where in zip(findings, ("50 %", "2:4")) if d == BETTER]
    against = any(d == WORSE for _, d in findings)
    summary = ("the usual finding (Wanda below magnitude) holds at both" if len(usual) == 2 else
               "unlike the usual finding (Wanda below magnitude)" if against else
               f"the usual finding (Wanda below magnitude) holds at {usual[0]} only" if usual else
               "the usual finding (Wanda below magnitude) is not established here")  # fmt: skip
    return f"AdamW, at this scale: Wanda gave {findings[0][0]}, and {findings[1][0]}; {summary}."


def pruners_markdown(study: Study, frame: pd.DataFrame, rows: Sequence[Row]) -> str:
    lines = [f"## One-shot pruners on GPT-2 ({_data(study, 'gpt2')}): magnitude vs Wanda", ""]
    if frame.empty:
        return "\n".join(lines + ["No GPT-2 runs."]) + "\n"
    table = frame.assign(column=[f"{m} {_pct(s) if p == 'unstructured' else p}" for m, p, s in
                                 zip(frame["method"], frame["pattern"], frame["sparsity"])])  # fmt: skip
    wide = table.pivot(index="variant", columns="column", values="text")
    wide = wide.reindex(index=list(dict.fromkeys(frame["variant"])), columns=list(dict.fromkeys(table["column"])))
    lines += [
        "Validation perplexity after pruning the trained model once (no retraining): mean ± sample std [n runs] "
        "over seeds (one run: its value). Unstructured 50 %: magnitude layerwise, Wanda per output row; 2:4: the "
        "2 largest scores of every 4 consecutive inputs.",
        "",
        *_markdown_frame(wide.reset_index(), len(wide.columns)),
        "",
        f"### Wanda vs magnitude, paired over seeds (perplexity ratio wanda / magnitude, {PERCENT} t-interval)",
        "",
    ]
    if rows:
        frame_rows = [[r.first[0], "50 %" if r.first[1].pattern == "unstructured" else r.first[1].pattern,
                       interval_text(r.paired.log_ratio, 3, ratio=True), signed(r.paired.difference.mean, 2),
                       r.paired.difference.n, r.paired.verdict] for r in rows]  # fmt: skip
        header = ["variant", "pattern", f"ratio [{PERCENT} CI]", "ppl difference", "n pairs", "verdict for Wanda"]
        lines += [*_markdown_frame(pd.DataFrame(frame_rows, columns=header), 0), ""]
    else:
        lines += ["No run has both Wanda and magnitude results (prune.methods=[magnitude,wanda]).", ""]
    lines.append(wanda_sentence(rows))
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------- claims


@dataclass
class Part:
    """One tested piece of a claim: what, how it came out, the statistic."""

    what: str
    direction: str | None  # BETTER: as the claim says; WORSE: against it; UNDECIDED; None: not testable here
    statistic: str

    @property
    def text(self) -> str:
        outcome = {BETTER: "supports", WORSE: "contradicts", UNDECIDED: "undecided", None: "not testable"}
        return f"{self.what}: {self.statistic}, {outcome[self.direction]}"


def verdict(parts: Sequence[Part]) -> str:
    tested = [p.direction for p in parts if p.direction is not None]
    if not tested:
        return NOT_TESTED
    if WORSE in tested:
        return NOT_REPRODUCED
    return REPRODUCED if all(d == BETTER for d in tested) else INCONCLUSIVE


def _gaps(study: Study, pipeline: str, first: str, second: str, cell: Cell, *, log: bool) -> dict[Any, float]:
    a, b = study.series(pipeline, first, cell), study.series(pipeline, second, cell)
    seeds, _ = pair(a, b, (first, second))
    return {s: math.log(a[s]) - math.log(b[s]) if log else a[s] - b[s] for s in seeds}


def _versus(study: Study, pipeline: str, first: str, second: str, cell: Cell, what: str) -> Part:
    paired = compare(study.series(pipeline, first, cell), study.series(pipeline, second, cell),
                     (first, second), log=pipeline == "gpt2")  # fmt: skip
    if not paired.seeds:
        return Part(what, None, "no pair of runs")
    return Part(what, paired.verdict, paired_text(paired))


def claim_accuracy(study: Study) -> list[Part]:
    """Claim 1: horst − adamw top-1 at the paper's sparsities present; then whether the gain at
    the better of 80/90 % exceeds the gain at each lower sparsity present."""
    cells = study.cells("vit", ("horst", "adamw"))
    named = [c for c in cells if round(c.sparsity, 6) in PAPER_GRID]
    parts = [_versus(study, "vit", "horst", "adamw", c, f"HORST − AdamW at {c.label}") for c in named]
    if not named:
        parts.append(Part("HORST vs AdamW at 70/80/90 %", None, "no ViT runs of both at these sparsities"))
    gains = {c: _gaps(study, "vit", "horst", "adamw", c, log=False) for c in named}
    peak = [c for c in named if round(c.sparsity, 6) in CLAIM_1_PEAK and gains[c]]
    lower = [c for c in named if c.sparsity < min(CLAIM_1_PEAK) and gains[c]]
    if peak and lower:
        top = max(peak, key=lambda c: np.mean(list(gains[c].values())))
        for c in lower:
            change = gap_change(gains[c], gains[top])
            parts.append(Part(f"gain at {top.label} minus gain at {c.label}",
                              direction(change, higher_is_better=True),
                              stated(change, 2, "top-1 points")))  # fmt: skip
    else:
        parts.append(Part("gain largest at 80-90 %", None,
                          "needs runs at 80 or 90 % and at a lower sparsity of the paper's grid"))  # fmt: skip
    beyond = [c for c in cells if c not in named]
    for c in beyond:
        part = _versus(study, "vit", "horst", "adamw", c, f"HORST − AdamW at {c.label}")
        parts.append(Part(part.what + " (beyond the paper's grid; not deciding)", None, part.statistic))
    return parts


def claim_perplexity(study: Study) -> list[Part]:
    """Claim 2: the horst / baseline perplexity ratio at every pruned magnitude-unstructured
    sparsity; the gap widens when the log ratio falls from the lowest to the highest."""
    parts = []
    for baseline, name in (("adamw", "AdamW"), ("ham", "HAM")):
        cells = [c for c in study.cells("gpt2", ("horst", baseline))
                 if (c.method, c.pattern) == ("magnitude", "unstructured")]  # pruned: not the dense model
        tested = [_versus(study, "gpt2", "horst", baseline, c, f"HORST / {name} at {c.label}") for c in cells]
        parts += tested or [Part(f"HORST vs {name} after pruning", None, f"no GPT-2 runs of HORST and {name}")]
        gaps = {c: _gaps(study, "gpt2", "horst", baseline, c, log=True) for c in cells}
        ends = [c for c in cells if gaps[c]]
        if len(ends) >= 2:
            change = gap_change(gaps[ends[0]], gaps[ends[-1]])
            parts.append(Part(f"gap to {name} widens from {ends[0].label} to {ends[-1].label} (ratio of the ratios)",
                              direction(change, higher_is_better=False),
                              stated(change, 3, ratio=True)))  # fmt: skip
        else:
            parts.append(Part(f"gap to {name} widens", None, "needs two pruned sparsities"))
    return parts


def weight_statistics(run: Run) -> tuple[float, float] | None:
    """(median log10|w|, % of weights with |w| < SMALL_WEIGHT) from the run's weight histogram."""
    histogram = weight_histogram(run)
    if histogram is None:
        return None
    counts, edges, _ = histogram
    counts, edges = np.asarray(counts, dtype=float), np.asarray(edges, dtype=float)
    cumulative = np.concatenate([[0.0], np.cumsum(counts)]) / counts.sum()
    below = float(np.interp(math.log10(SMALL_WEIGHT), edges, cumulative))  # linear within a bin
    return make_tables._median_from_histogram(counts.tolist(), edges.tolist()), 100.0 * below


def claim_weights(study: Study) -> list[Part]:
    """Claim 3 on GPT-2's trained (dense) weights: HORST's median log10|w| lower and its share
    of weights below 1e-3 higher than AdamW's, paired over seeds."""
    by_variant = {v: {seed: weight_statistics(run) for seed, run in study.runs.get(("gpt2", v, None), {}).items()}
                  for v in ("horst", "adamw")}  # fmt: skip
    if not all(by_variant.values()):
        return [Part("HORST vs AdamW weights (GPT-2)", None, "needs GPT-2 runs of both with weight_histogram.json")]
    parts = []
    statistics = ((0, "median log10|w|, HORST − AdamW", "decades", False),
                  (1, f"% of weights with |w| < {SMALL_WEIGHT:g}, HORST − AdamW", "points", True))  # fmt: skip
    for index, what, unit, higher in statistics:
        a = {s: v[index] for s, v in by_variant["horst"].items() if v is not None}
        b = {s: v[index] for s, v in by_variant["adamw"].items() if v is not None}
        paired = compare(a, b, ("horst", "adamw"), log=False)
        if not paired.seeds:
            parts.append(Part(what, None, "no seed with both histograms"))
            continue
        parts.append(Part(what, direction(paired.difference, higher_is_better=higher),
                          stated(paired.difference, 3, unit)))  # fmt: skip
    return parts


RULES = f"""### Rules

* A comparison supports a claim where its {PERCENT} t-interval of the paired mean (over seeds)
  excludes 0 (ratios: 1) in the claimed direction, contradicts it where it excludes 0 in the other
  direction, and decides nothing otherwise (always with one pair, which has no interval).
* **reproduced**: every tested part supports the claim; **not reproduced**: any tested part contradicts
  it; **inconclusive at this scale**: otherwise. Parts without runs are named "not testable" and do not
  decide; a claim with no tested part reads "not tested (no runs)".
* Claim 1: HORST − AdamW top-1 of the final sparse ViT at each of the paper's sparsities (70, 80, 90 %)
  that was run; "largest at 80-90 %": the gain at whichever of 80/90 % has the larger mean, minus the
  gain at each lower sparsity of the paper's grid that was run (paired over seeds, > 0 claimed). Other
  sparsities are shown, not deciding: the paper's claim is about its grid.
* Claim 2: the perplexity ratio HORST / AdamW and HORST / HAM after one-shot layerwise magnitude pruning at
  every pruned sparsity run (< 1 claimed); "the gap widens": the ratio at the highest sparsity divided by the
  ratio at the lowest pruned one, per seed (< 1 claimed: HORST's relative advantage grows).
* Claim 3: the GPT-2 models' prunable weights after training (weight_histogram.json, log10|w|): HORST −
  AdamW median log10|w| (< 0 claimed) and share of weights below {SMALL_WEIGHT:g} (> 0 claimed), paired
  over seeds; "near-Gaussian" is not tested. The ViT's histograms are not used: under AC/DC every dense
  epoch after the first pruning holds weights regrown from zero, a mode that is the schedule's, not the
  optimizer's.
"""


CONTROL_CELLS = {"vit": None, "gpt2": (0.0, 0.5, 0.9)}  # None: every cell the control ran
CONTROL_NAMES = {"adamw": "AdamW", "horst": "HORST", "adamw_decay": "AdamW with HORST's decay"}


def control_markdown(study: Study) -> str:
    """HORST against the decay-matched AdamW (`adamw_decay`), and that AdamW against AdamW: how
    much of HORST's advantage over AdamW more decay alone gives. Empty without such runs."""
    lines = []
    for pipeline, scale in (("gpt2", "GPT-2, perplexity ratio"), ("vit", "ViT under AC/DC, top-1 points")):
        operator = " / " if pipeline == "gpt2" else " − "
        for first, second in (("adamw_decay", "adamw"), ("horst", "adamw"), ("horst", "adamw_decay")):
            what = operator.join(CONTROL_NAMES[v] for v in (first, second))
            cells = [c for c in study.cells(pipeline, ("adamw_decay",)) if c in study.cells(pipeline, (first,))
                     and (c.method, c.pattern) in (("acdc", "unstructured"), ("magnitude", "unstructured"), ("none", "dense"))
                     and (CONTROL_CELLS[pipeline] is None or c.sparsity in CONTROL_CELLS[pipeline])]  # fmt: skip
            parts = [_versus(study, pipeline, first, second, c, c.label) for c in cells]
            if parts:
                lines.append(f"- {scale}, {what}: " + "; ".join(f"{p.what}: {p.statistic} ({p.direction or 'no pair'})" for p in parts))
    if not lines:
        return ""
    return "\n".join([
        "## Control: AdamW that decays as hard as HORST",
        "",
        "HORST shrinks a mirrored weight by about 1 − lr (weight decay + beta) per step, AdamW by 1 − lr weight "
        "decay. `adamw_decay` is AdamW with weight decay = HORST's weight decay + beta: if HORST's advantage "
        "over AdamW were only its stronger decay, this AdamW would have it too. Paired over seeds as above; "
        "GPT-2 after one-shot magnitude pruning.",
        "",
        *lines,
    ]) + "\n"


def claims_markdown(study: Study) -> str:
    judged = (
        ("ViT on 8x8 digits under AC/DC, not DeiT on ImageNet", claim_accuracy(study)),
        ("a tiny GPT-2 on pydoc text, not GPT-2 Small on SlimPajama-6B", claim_perplexity(study)),
        ("the tiny GPT-2's trained weights", claim_weights(study)),
    )
    lines = [
        "## The paper's claims at this scale",
        "",
        "Judged on the embedded benchmarks, which are tiny models on tiny data, not the paper's DeiT / "
        "GPT-2 Small: a claim not reproduced here says what happens at this scale, not that the paper is wrong.",
        "",
    ]
    for number, (claim, (scale, parts)) in enumerate(zip(CLAIMS, judged), start=1):
        lines.append(f"{number}. **{verdict(parts)}**: \"{claim}\" At this scale ({scale}): "
                     + "; ".join(p.text for p in parts) + ".")  # fmt: skip
    control = control_markdown(study)
    return "\n".join(lines) + "\n\n" + (control + "\n" if control else "") + RULES


# ---------------------------------------------------------------------------------- main


def _existing(runs_dir: Path, folders: Sequence[Path] | None) -> list[Path]:
    if folders is None:
        return [runs_dir]
    return [Path(f) for f in folders if Path(f).is_dir()] or [runs_dir]


def write_report(runs_dir: Path, out: Path, *, folders: Sequence[Path] | None = None) -> str:
    """Write paired.{md,csv}, pruners.{md,csv}, claims.md and make_tables' tables and figures
    into `out`; return the markdown of claims.md, paired.md, pruners.md and tables.md. The runs
    are those below `runs_dir`, or only below `folders` (a study's planned multiruns: runs of
    another plan left in the same folder stay out)."""
    runs_dir, out = Path(runs_dir), Path(out)
    tables = make_tables.make_tables(_existing(runs_dir, folders), out)
    study = load(runs_dir, folders)
    rows, not_compared = optimizer_rows(study)
    pruners = pruner_rows(study)
    rows_frame([*rows, *pruners]).to_csv(out / "paired.csv", index=False)
    pruner_table = pruners_frame(study)
    pruner_table.drop(columns="text", errors="ignore").to_csv(out / "pruners.csv", index=False)
    sections = {
        "claims.md": claims_markdown(study),
        "paired.md": paired_markdown(study, rows, not_compared),
        "pruners.md": pruners_markdown(study, pruner_table, pruners),
    }
    for name, text in sections.items():
        (out / name).write_text(text)
    return "\n".join(sections.values()) + "\n## Tables and figures (scripts/make_tables.py)\n\n" + tables


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs_dir", help="the study's run folders: <runs>/vit/<variant>/s<sparsity>/seed<k>, "
                                         "<runs>/gpt2/<variant>/seed<k>")
    parser.add_argument("--out", required=True, help="folder for the report, tables and figures")
    args = parser.parse_args(argv)
    try:
        text = write_report(Path(args.runs_dir), Path(args.out))
    except NoRunsError as error:
        sys.exit(f"error: {error}")
    print(text.split("\n## Tables and figures")[0])
    print(f"written to {args.out}/")


if __name__ == "__main__":
    main()
