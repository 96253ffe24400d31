"""The paper's tables and figures from run folders (their `summary.json` files; W&B not needed).

    python scripts/make_tables.py outputs/demo --out results/demo
    python scripts/make_tables.py multirun/vit multirun/gpt2 --out results/sweep

Every folder below the given ones that holds a `summary.json` (written by `train_gpt2.py`
or `train_vit.py` at the end of a run) is one run. Runs that differ only in their seed form
one cell: mean ± sample std over them, with their count. Written into `--out`:

* `tables.md`: both tables in markdown (also printed), the comparison with the paper's
  claims (`results/paper/claims.md`) and the list of runs;
* `vit_acdc.{csv,tex}`: the DeiT/ViT AC/DC table, top-1 (%) of the final sparse model;
  rows model x optimizer, columns the AC/DC sparsity; the paper's number beside ours where
  `results/paper/deit_imagenet_acdc.csv` has it (ImageNet-1k runs of the same timm model);
* `gpt2_pruning.{csv,tex}`: the GPT-2 table, validation perplexity after one-shot magnitude
  pruning; rows optimizer (with alpha/beta), columns the pruning sparsity (the paper states
  no GPT-2 numbers, only claims);
* `accuracy_vs_sparsity.png`, `perplexity_vs_sparsity.png`: per optimizer, mean ± std;
* `weight_distribution.png`: log10|w| of the prunable weights, AdamW vs HAM vs HORST, from
  the first of these a run folder holds: `weight_histogram.json` (``{"counts": [...],
  "edges": [...]}`` of log10|w|, edges one longer), the `weights/log10_abs_*` records of
  `metrics.jsonl` (the ViT pipeline logs one per epoch; the last one of a dense epoch is
  used, before AC/DC's final pruning), or the newest checkpoint
  (`ckpt_*.pt`, loaded with ``weights_only=True``; the prunable matrices are found by the
  run's pruning preset). Runs with none of these are left out of that figure, with a note.

The CSV files are tidy (one line per cell) for further processing; a cell's row label adds
any setting (lr, steps, ...) in which runs of the same model and optimizer differ, so runs
of different settings are never averaged together.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAPER_CSV = REPO / "results" / "paper" / "deit_imagenet_acdc.csv"
SUMMARY = "summary.json"
HISTOGRAM_FILE = "weight_histogram.json"
OPTIMIZER_ORDER = ("adamw", "ham", "horst")
IMAGENET_CLASSES = 1000


class NoRunsError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------- runs


@dataclass
class Run:
    folder: Path
    summary: dict[str, Any]

    @property
    def pipeline(self) -> str:
        return self.summary["pipeline"]

    @property
    def seed(self) -> Any:
        return self.summary.get("seed")


def find_runs(dirs: Sequence[str | Path]) -> list[Run]:
    """Every run folder (one holding summary.json) below `dirs`, in path order."""
    missing = [str(d) for d in dirs if not Path(d).is_dir()]
    if missing:
        raise NoRunsError(f"no such folder: {', '.join(missing)}")
    runs, seen = [], set()
    for d in dirs:
        for path in sorted(Path(d).rglob(SUMMARY)):
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            try:
                summary = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as error:
                print(f"note: skipped {path}: unreadable ({error})", file=sys.stderr)
                continue
            if not isinstance(summary, dict) or summary.get("pipeline") not in ("gpt2", "vit"):
                print(f"note: skipped {path}: not a train_gpt2.py/train_vit.py summary (no pipeline key)", file=sys.stderr)
                continue
            runs.append(Run(path.parent, summary))
    if not runs:
        raise NoRunsError(
            f"no {SUMMARY} found under {', '.join(map(str, dirs))}: a run writes it when it finishes "
            "(python train_gpt2.py / python train_vit.py, or make demo); pass the folders that hold the runs"
        )
    return runs


# ------------------------------------------------------------------------- row labels


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def optimizer_label(opt: dict[str, Any]) -> str:
    """`adamw`, `ham (alpha=200, beta=0.001)`, `horst (alpha=10, beta=0.1)`; HORST's ablation
    order reads `horst-sm (...)`."""
    name = opt["name"]
    if name == "horst" and opt.get("order", "ms") != "ms":
        name = f"horst-{opt['order']}"
    if "alpha" in opt:
        return f"{name} (alpha={_fmt(opt['alpha'])}, beta={_fmt(opt['beta'])})"
    return name


def model_label(summary: dict[str, Any]) -> str:
    model = summary["model"]
    if model.get("preset"):
        return model["preset"]
    if summary["pipeline"] == "vit":
        return model["timm_name"]
    return f"gpt2 {model['n_layer']}x{model['n_embd']}"


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = tuple(value) if isinstance(value, list) else value


def setting(summary: dict[str, Any]) -> dict[str, Any]:
    """What defines a run's experiment besides its seed and the table's row/column keys:
    runs that agree on all of it are seeds of one cell."""
    s = summary
    if s["pipeline"] == "gpt2":
        t = s.get("train", {})
        parts = {
            "model": {k: v for k, v in s["model"].items() if k not in ("parameters", "prunable_parameters")},
            "optimizer": s["optimizer"],
            "data": s.get("data", {}).get("name"),
            "train": {k: t.get(k) for k in ("steps", "batch_size", "context")},
            "prune": {k: s.get("pruning", {}).get(k) for k in ("scope", "preset")},
        }
    else:
        t = s.get("train", {})
        acdc = {k: v for k, v in s.get("acdc", {}).items() if k not in ("sparsity", "prune_epochs", "restore_epochs")}
        parts = {
            "model": {k: v for k, v in s["model"].items() if k not in ("parameters", "prunable_parameters")},
            "optimizer": s["optimizer"],
            "data": {k: s.get("data", {}).get(k) for k in ("name", "root", "num_classes")},
            "train": {k: t.get(k) for k in ("epochs", "batch_size")},
            "acdc": acdc,
        }
    flat: dict[str, Any] = {}
    _flatten("", parts, flat)
    return flat


# ------------------------------------------------------------------------------- cells


@dataclass
class Row:
    data: str
    model: str
    optimizer: str  # label, with alpha/beta and any distinguishing setting
    optimizer_name: str
    alpha: float | None = None
    beta: float | None = None
    values: dict[float, list[float]] = field(default_factory=lambda: defaultdict(list))
    seeds: dict[float, list[Any]] = field(default_factory=lambda: defaultdict(list))
    folders: dict[float, list[Path]] = field(default_factory=lambda: defaultdict(list))
    paper: dict[float, float] = field(default_factory=dict)
    timm_name: str | None = None
    imagenet: bool = False  # an ImageNet-1k ViT/DeiT row: the paper's numbers apply

    def stats(self, sparsity: float) -> tuple[float, float, int] | None:
        values = [v for v in self.values.get(sparsity, []) if v is not None and math.isfinite(v)]
        if not values:
            return None
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return statistics.fmean(values), std, len(values)


@dataclass
class Table:
    key: str  # vit_acdc | gpt2_pruning
    title: str
    metric: str  # the CSV's name for the values
    note: str
    rows: list[Row]
    decimals: int = 2

    @property
    def sparsities(self) -> list[float]:
        return sorted({s for row in self.rows for s in (*row.values, *row.paper)})


def _cells(run: Run) -> list[tuple[float, float | None]]:
    """(sparsity, value) pairs of one run: its AC/DC top-1 in %, or its perplexity at each
    one-shot sparsity."""
    s = run.summary
    if run.pipeline == "vit":
        top1 = s.get("top1")
        return [(float(s["target_sparsity"]), None if top1 is None else 100.0 * top1)]
    if "pruning" in s:
        return [(float(r["sparsity"]), r["ppl"]) for r in s["pruning"]["results"]]
    return [(float(k), v) for k, v in s["ppl"].items()]


def is_imagenet(run: Run) -> bool:
    return run.pipeline == "vit" and run.summary["data"].get("num_classes") == IMAGENET_CLASSES


def build_rows(runs: list[Run], paper: dict[tuple[str, str, float], float]) -> list[Row]:
    """Rows of one pipeline's runs; the row label gains the settings in which runs of the
    same (data, model, optimizer) differ, so different experiments are never averaged."""
    groups: dict[tuple[str, str, str], list[Run]] = defaultdict(list)
    for run in runs:
        s = run.summary
        groups[(s["data"]["name"], model_label(s), optimizer_label(s["optimizer"]))].append(run)

    rows: dict[tuple, Row] = {}
    for (data, model, label), members in groups.items():
        settings = [setting(r.summary) for r in members]
        keys = sorted({k for st in settings for k in st})
        differing = [k for k in keys if len({repr(st.get(k)) for st in settings}) > 1]
        for run, st in zip(members, settings):
            extra = ", ".join(f"{k}={_fmt(st.get(k))}" for k in differing)
            full = f"{label} [{extra}]" if extra else label
            opt = run.summary["optimizer"]
            row = rows.setdefault(
                (data, model, full),
                Row(data, model, full, opt["name"], opt.get("alpha"), opt.get("beta"),
                    timm_name=run.summary["model"].get("timm_name"), imagenet=is_imagenet(run)),
            )  # fmt: skip
            for sparsity, value in _cells(run):
                row.values[sparsity].append(value)
                row.seeds[sparsity].append(run.seed)
                row.folders[sparsity].append(run.folder)

    for row in rows.values():
        for sparsity, seeds in row.seeds.items():
            if len(set(map(repr, seeds))) < len(seeds):
                print(f"note: {row.model} {row.optimizer} at {_pct(sparsity)} has several runs with the same seed "
                      f"({', '.join(map(str, row.folders[sparsity]))}); all are averaged", file=sys.stderr)  # fmt: skip

    # The paper's numbers beside ImageNet-1k runs of the paper's timm model, and a row for
    # each paper number of such a model whose optimizer we did not run.
    result = list(rows.values())
    for row in result:
        if row.imagenet:
            row.paper = {s: top1 for (m, o, s), top1 in paper.items() if (m, o) == (row.timm_name, row.optimizer_name)}
    for data, model, timm_name in sorted({(r.data, r.model, r.timm_name) for r in result if r.imagenet}):
        ran = {r.optimizer_name for r in result if (r.data, r.model) == (data, model)}
        for (paper_model, optimizer, sparsity), top1 in paper.items():
            if paper_model != timm_name or optimizer in ran:
                continue
            row = next((r for r in result if (r.data, r.model, r.optimizer) == (data, model, optimizer)), None)
            if row is None:
                row = Row(data, model, optimizer, optimizer, timm_name=timm_name, imagenet=True)
                result.append(row)
            row.paper[sparsity] = top1

    def order(row: Row) -> tuple:
        rank = OPTIMIZER_ORDER.index(row.optimizer_name) if row.optimizer_name in OPTIMIZER_ORDER else len(OPTIMIZER_ORDER)
        return (row.data, row.model, rank, row.optimizer)

    return sorted(result, key=order)


def load_paper(path: Path) -> dict[tuple[str, str, float], float]:
    """{(timm model, optimizer, sparsity): top-1 %} from the paper's CSV (empty if absent)."""
    if not path.is_file():
        print(f"note: {path} not found; no paper numbers in the tables", file=sys.stderr)
        return {}
    with open(path, newline="") as f:
        return {(r["model"], r["optimizer"], float(r["sparsity"])): float(r["top1"]) for r in csv.DictReader(f)}


def build_tables(runs: list[Run], paper: dict[tuple[str, str, float], float]) -> list[Table]:
    tables = []
    vit = [r for r in runs if r.pipeline == "vit"]
    if vit:
        tables.append(
            Table(
                "vit_acdc",
                "ViT/DeiT under AC/DC: top-1 accuracy (%) of the final sparse model",
                "top1_percent",
                "Columns: AC/DC target sparsity of the prunable block matrices. Higher is better. "
                "Paper numbers (in parentheses) exist only for DeiT on ImageNet-1k "
                "(results/paper/deit_imagenet_acdc.csv).",
                build_rows(vit, paper),
            )
        )
    gpt2 = [r for r in runs if r.pipeline == "gpt2"]
    if gpt2:
        scopes = sorted({str(r.summary.get("pruning", {}).get("scope", "layerwise")) for r in gpt2})
        tables.append(
            Table(
                "gpt2_pruning",
                f"GPT-2: validation perplexity after one-shot {'/'.join(scopes)} magnitude pruning",
                "val_perplexity",
                "Columns: sparsity of the prunable block matrices, pruned once after training, no retraining. "
                "Lower is better. The paper states no GPT-2 numbers, only that HORST's perplexity after "
                "pruning is lower than AdamW's and HAM's, with the gap widening with sparsity "
                "(results/paper/claims.md).",
                build_rows(gpt2, paper),
            )
        )
    return tables


# ---------------------------------------------------------------------------- rendering


def _pct(sparsity: float) -> str:
    return f"{100 * sparsity:g} %"


def cell_text(row: Row, sparsity: float, decimals: int, *, pm: str = "±", dash: str = "–") -> str:
    stats = row.stats(sparsity)
    if stats is None:
        ours = dash
    else:
        mean, std, n = stats
        ours = f"{mean:.{decimals}f} {pm} {std:.{decimals}f} [n={n}]" if n > 1 else f"{mean:.{decimals}f}"
    if sparsity in row.paper:
        return f"{ours} ({row.paper[sparsity]:.2f})"
    return ours


def markdown(table: Table) -> str:
    header = ["data", "model", "optimizer", *(_pct(s) for s in table.sparsities)]
    lines = [
        f"### {table.title}",
        "",
        "Cells: ours, mean ± std over seeds [n runs] where a cell has several runs, one run otherwise; "
        "(paper) where the paper states the number. " + table.note,
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] * 3 + ["---:"] * len(table.sparsities)) + "|",
    ]
    for row in table.rows:
        cells = [row.data, row.model, row.optimizer, *(cell_text(row, s, table.decimals) for s in table.sparsities)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


_LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}  # fmt: skip


def latex_escape(text: str) -> str:
    return "".join(_LATEX_ESCAPES.get(c, c) for c in text)


def latex(table: Table) -> str:
    """A booktabs table (\\usepackage{booktabs})."""
    cols = table.sparsities
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\caption{" + latex_escape(table.title) + r". Mean $\pm$ std over seeds [n runs] where a cell has several, "
        r"one run otherwise; (paper) where the paper states the number. " + latex_escape(table.note) + "}",
        r"\label{tab:" + table.key.replace("_", "-") + "}",
        r"\begin{tabular}{lll" + "r" * len(cols) + "}",
        r"\toprule",
        " & ".join(["Data", "Model", "Optimizer", *(latex_escape(_pct(s)) for s in cols)]) + r" \\",
        r"\midrule",
    ]
    for row in table.rows:
        cells = [latex_escape(row.data), latex_escape(row.model), latex_escape(row.optimizer)]
        cells += [latex_escape(cell_text(row, s, table.decimals, pm="PLUSMINUS", dash="--")).replace("PLUSMINUS", r"$\pm$")
                  for s in cols]  # fmt: skip
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def write_csv(table: Table, path: Path, *, relative_to: Path) -> None:
    fields = ["data", "model", "optimizer", "optimizer_name", "alpha", "beta", "sparsity", "metric",
              "mean", "std", "n", "seeds", "paper", "runs"]  # fmt: skip
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in table.rows:
            for s in table.sparsities:
                stats = row.stats(s)
                if stats is None and s not in row.paper:
                    continue
                mean, std, n = stats if stats else (None, None, 0)
                writer.writerow({
                    "data": row.data, "model": row.model, "optimizer": row.optimizer,
                    "optimizer_name": row.optimizer_name, "alpha": row.alpha, "beta": row.beta,
                    "sparsity": s, "metric": table.metric,
                    "mean": "" if mean is None else repr(mean), "std": repr(std) if n > 1 else "", "n": n,
                    "seeds": ";".join(map(str, row.seeds.get(s, []))),
                    "paper": row.paper.get(s, ""),
                    "runs": ";".join(_relative(p, relative_to) for p in row.folders.get(s, [])),
                })  # fmt: skip


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------- claims (in words)


def _by_optimizer(rows: Iterable[Row], name: str) -> list[Row]:
    return [r for r in rows if r.optimizer_name == name and r.values]


def claims(tables: list[Table]) -> list[str]:
    """Each HORST row against each AdamW/HAM row of the same data and model: the paper's claims
    1 (ViT: higher accuracy) and 2 (GPT-2: lower perplexity, widening gap), read off our means."""
    lines = []
    for table in tables:
        lower_is_better = table.key == "gpt2_pruning"
        groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
        for row in table.rows:
            groups[(row.data, row.model)].append(row)
        for (data, model), rows in groups.items():
            for horst_row in _by_optimizer(rows, "horst"):
                for baseline in (*_by_optimizer(rows, "adamw"), *_by_optimizer(rows, "ham")):
                    common = [s for s in table.sparsities if horst_row.stats(s) and baseline.stats(s)]
                    if not common:
                        continue
                    # gap > 0: HORST is better
                    gaps = {s: baseline.stats(s)[0] - horst_row.stats(s)[0] for s in common}
                    if not lower_is_better:
                        gaps = {s: -g for s, g in gaps.items()}
                    wins = sum(g > 0 for g in gaps.values())
                    unit = "perplexity" if lower_is_better else "top-1 points"
                    detail = ", ".join(f"{_pct(s)}: {gaps[s]:+.2f}" for s in common)
                    line = (
                        f"- {table.key} {data}/{model}: {horst_row.optimizer} better than {baseline.optimizer} "
                        f"at {wins} of {len(common)} sparsities (HORST's advantage in {unit}: {detail})"
                    )
                    if lower_is_better and len(common) > 1:
                        widens = gaps[common[-1]] > gaps[common[0]]
                        line += f"; the gap {'widens' if widens else 'does not widen'} from {_pct(common[0])} to {_pct(common[-1])}"
                    lines.append(line + ".")
    return lines


# ---------------------------------------------------------------------------- figures


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(table: Table) -> dict[tuple[str, str], list[Row]]:
    panels: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in table.rows:
        panels[(row.data, row.model)].append(row)
    return panels


def metric_figure(table: Table, path: Path, *, ylabel: str, log_y: bool = False) -> None:
    plt = _pyplot()
    panels = _panels(table)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, ((data, model), rows) in zip(axes[0], panels.items()):
        for i, row in enumerate(rows):
            color = f"C{i}"
            xs = [s for s in table.sparsities if row.stats(s)]
            if xs:
                means, stds = zip(*[(row.stats(s)[0], row.stats(s)[1]) for s in xs])
                ax.errorbar([100 * x for x in xs], means, yerr=stds, marker="o", capsize=3, color=color, label=row.optimizer)
            if row.paper:
                px = sorted(row.paper)
                ax.plot([100 * x for x in px], [row.paper[x] for x in px], "x", ms=9, mew=2, color=color,
                        label=f"{row.optimizer_name} (paper)")  # fmt: skip
        ax.set_title(f"{model} ({data})")
        ax.set_xlabel("sparsity (%)")
        ax.set_ylabel(ylabel)
        if log_y:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(table.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _module_patterns(summary: dict[str, Any]) -> list[str]:
    import pruning

    if summary["pipeline"] == "gpt2":
        preset, extra = summary.get("pruning", {}).get("preset", "gpt2"), []
    else:
        acdc = summary.get("acdc", {})
        preset, extra = acdc.get("preset", "vit"), list(acdc.get("patterns") or [])
    return ([*pruning.PRESETS[preset]] if preset else []) + extra


def weight_histogram(run: Run, *, bins: int = 100) -> tuple[list[float], list[float], str] | None:
    """(counts, edges, where from) of log10|w| over the run's non-zero prunable weights, or None.

    From `metrics.jsonl` (ViT: one histogram per epoch) the last one taken with the model
    dense is used, i.e. at the end of the last decompressed phase before the final pruning:
    the final sparse model's non-zero weights are only the largest 10-30 %, whose shape says
    little about how the optimizer spreads the weights."""
    file = run.folder / HISTOGRAM_FILE
    if file.is_file():
        data = json.loads(file.read_text())
        return data["counts"], data["edges"], HISTOGRAM_FILE
    metrics = run.folder / "metrics.jsonl"
    if metrics.is_file():
        histograms, phases = [], {}
        for line in metrics.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "weights/log10_abs_counts" in record:
                histograms.append(record)
            if "val/phase" in record:
                phases[record["step"]] = record["val/phase"]
        dense = [h for h in histograms if phases.get(h["step"]) in ("dense", "decompressed")]
        if histograms:
            chosen = (dense or histograms)[-1]
            where = f"metrics.jsonl, epoch {chosen.get('epoch', '?')} ({phases.get(chosen['step'], 'phase unknown')})"
            return chosen["weights/log10_abs_counts"], chosen["weights/log10_abs_edges"], where
    checkpoints = sorted(run.folder.glob("ckpt_*.pt"))
    if checkpoints:
        import torch

        import pruning

        state = torch.load(checkpoints[-1], map_location="cpu", weights_only=True)["model"]
        patterns = [re.compile(p) for p in _module_patterns(run.summary)]
        weights = {
            name: tensor for name, tensor in state.items()
            if name.endswith(".weight") and tensor.ndim >= 2 and any(p.search(name.removesuffix(".weight")) for p in patterns)
        }  # fmt: skip
        if weights:
            counts, edges = pruning.magnitude_histogram(weights, bins=bins, log=True)
            return counts.tolist(), edges.tolist(), checkpoints[-1].name
    return None


def _median_from_histogram(counts: Sequence[float], edges: Sequence[float]) -> float:
    half, total = sum(counts) / 2, 0.0
    for i, c in enumerate(counts):
        if total + c >= half and c > 0:
            return edges[i] + (half - total) / c * (edges[i + 1] - edges[i])
        total += c
    return edges[-1]


def weight_figure(runs: list[Run], path: Path) -> list[str]:
    """log10|w| densities per optimizer, one panel per (pipeline, data, model); for ViT the
    run at the highest sparsity. Returns notes (where each came from, median |w|)."""
    panels: dict[tuple[str, str, str], dict[str, Run]] = defaultdict(dict)
    notes: list[str] = []
    for run in sorted(runs, key=lambda r: (str(r.summary.get("target_sparsity", 0)), str(r.seed), str(r.folder))):
        key = (run.pipeline, run.summary["data"]["name"], model_label(run.summary))
        label = optimizer_label(run.summary["optimizer"])
        current = panels[key].get(label)
        # ViT: the highest sparsity; among equals, the first seed
        if current is None or run.summary.get("target_sparsity", 0) > current.summary.get("target_sparsity", 0):
            panels[key][label] = run
    drawn: dict[tuple[str, str, str], list[tuple[str, Run, tuple]]] = {}
    for key, by_label in panels.items():
        for label, run in by_label.items():
            hist = weight_histogram(run)
            if hist is None:
                notes.append(f"no weight histogram, metrics record or checkpoint in {run.folder}: left out of the weight figure")
                continue
            drawn.setdefault(key, []).append((label, run, hist))
    if not drawn:
        return notes + ["weight-distribution figure skipped: no run folder holds weights or a histogram"]

    plt = _pyplot()
    fig, axes = plt.subplots(1, len(drawn), figsize=(5.5 * len(drawn), 4), squeeze=False)
    for ax, ((pipeline, data, model), items) in zip(axes[0], drawn.items()):
        order = {name: i for i, name in enumerate(OPTIMIZER_ORDER)}
        items.sort(key=lambda item: (order.get(item[1].summary["optimizer"]["name"], 9), item[0]))
        sparsity = items[0][1].summary.get("target_sparsity")
        for label, run, (counts, edges, source) in items:
            total = sum(counts)
            widths = [b - a for a, b in zip(edges, edges[1:])]
            density = [c / (total * w) if total and w else 0.0 for c, w in zip(counts, widths)]
            median = _median_from_histogram(counts, edges)
            ax.stairs(density, edges, label=f"{label}: median |w| {10 ** median:.2g}", linewidth=1.5)
            notes.append(f"{pipeline} {data}/{model} {label}: median |w| of the non-zero prunable weights "
                         f"{10 ** median:.3g} (from {run.folder.name}: {source})")  # fmt: skip
        where = items[0][2][2]
        if pipeline == "gpt2":
            what = "trained model, before pruning"
        elif "decompressed" in where:
            # The weights pruned until the last restore grew back from 0 since: the left mode.
            what = (f"AC/DC at {_pct(sparsity)}, last dense epoch before the final pruning\n"
                    "(left mode: weights regrown from 0 since the last restore)")  # fmt: skip
        elif "(dense)" in where:
            what = f"AC/DC at {_pct(sparsity)}, last dense epoch"
        else:
            what = f"AC/DC at {_pct(sparsity)}, {where}"
        ax.set_title(f"{model} ({data}): {what}", fontsize=9)
        ax.set_xlabel("log10 |w| of the prunable weights")
        ax.set_ylabel("density")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Weight-magnitude distribution: AdamW vs HAM vs HORST", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return notes


# -------------------------------------------------------------------------------- main


def _short_commit(commit: str | None) -> str:
    """First 12 hex digits, keeping the `-dirty` mark of run_log.git_commit."""
    if not commit:
        return "unknown"
    return commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")


def make_tables(dirs: Sequence[str | Path], out: str | Path, *, paper_csv: Path = PAPER_CSV) -> str:
    """Write tables, figures and tables.md into `out`; return the markdown."""
    runs = find_runs(dirs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tables = build_tables(runs, load_paper(paper_csv))
    sections = []
    for table in tables:
        sections.append(markdown(table))
        (out / f"{table.key}.tex").write_text(latex(table))
        write_csv(table, out / f"{table.key}.csv", relative_to=Path.cwd())
    figures = []
    for table in tables:
        if table.key == "vit_acdc":
            metric_figure(table, out / "accuracy_vs_sparsity.png", ylabel="top-1 accuracy (%)")
            figures.append("accuracy_vs_sparsity.png")
        else:
            metric_figure(table, out / "perplexity_vs_sparsity.png", ylabel="validation perplexity", log_y=True)
            figures.append("perplexity_vs_sparsity.png")
    notes = weight_figure(runs, out / "weight_distribution.png")
    if (out / "weight_distribution.png").is_file() and not any(n.startswith("weight-distribution figure skipped") for n in notes):
        figures.append("weight_distribution.png")
    for note in notes:
        if "left out" in note or "skipped" in note:
            print(f"note: {note}", file=sys.stderr)

    comparison = claims(tables)
    text = "\n".join(sections)
    text += "\n### Against the paper's claims (our means; not a significance test)\n\n"
    text += "\n".join(comparison) if comparison else "- no HORST run with an AdamW or HAM run of the same data and model"
    text += "\n\n### Weight magnitudes\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    text += "\n### Files\n\n" + "\n".join(
        [f"- {t.key}.csv, {t.key}.tex" for t in tables] + [f"- {f}" for f in figures]
    )
    text += f"\n\n### Runs ({len(runs)})\n\n" + "\n".join(
        f"- {_relative(r.folder, Path.cwd())}: {r.pipeline}, {model_label(r.summary)}, "
        f"{optimizer_label(r.summary['optimizer'])}, seed {r.seed}, commit {_short_commit(r.summary.get('git_commit'))}"
        for r in runs
    ) + "\n"  # fmt: skip
    (out / "tables.md").write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", help="folders searched recursively for summary.json")
    parser.add_argument("--out", required=True, help="folder for the tables and figures")
    parser.add_argument("--paper", default=str(PAPER_CSV), help="the paper's numbers (CSV; default %(default)s)")
    args = parser.parse_args(argv)
    try:
        text = make_tables(args.run_dirs, args.out, paper_csv=Path(args.paper))
    except NoRunsError as error:
        sys.exit(f"error: {error}")
    # The tables (not the run list) to the terminal.
    print(text.split("\n### Files")[0])
    print(f"written to {args.out}/")


if __name__ == "__main__":
    main()
