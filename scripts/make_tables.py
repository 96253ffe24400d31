"""The paper's tables and figures from run folders (`config.yaml`, `summary.json`, `failed.json`; W&B not needed).

    python scripts/make_tables.py outputs/demo --out results/demo
    python scripts/make_tables.py multirun/vit multirun/gpt2 --out results/sweep

Every folder below the given ones that holds a `summary.json` (written by `train_gpt2.py`
or `train_vit.py` at the end of a run) is a finished run; one that holds a `failed.json`
(non-finite loss, bad config, a crashed sweep cell) is a failed run; one that holds only a
`config.yaml` (written at start-up) is unfinished. Hidden folders (Hydra's `.hydra/`,
submitit's `.submitit/`) are not searched. Nothing is dropped silently: every folder
found is in a table, or listed under "Failed runs" or "Skipped" with the reason.

**Experiment signature.** Runs are grouped by their full resolved config (`config.yaml`;
for older folders without it, the settings recorded in `summary.json`), flattened to dotted
keys, *minus*:

* `seed`: runs that differ only in it are the seeds of one cell (mean ± sample std, n);
* `logging.*` (W&B project, name, tags), `resume`, `hydra.*`, and any key naming the run
  folder (`run_dir`, `output_dir`, `out_dir`): where and how a run is recorded;
* keys that change neither the data a run sees nor its arithmetic, so that a rerun with more
  workers or another checkpoint cadence still averages with the first:
  `data.num_workers`, `data.pin_memory` (every sample's augmentation is seeded by its
  own (seed, epoch, index) seed, not by the worker that loads it), `cpu_threads`,
  `train.log_interval`, `train.checkpoint_interval`, `train.keep_checkpoints`,
  `train.peak_tflops` (MFU reporting only).

`device`, `precision`, `compile` and `deterministic` stay in the signature: under
`precision: auto` a CUDA run computes in bf16 and a CPU run in fp32, so they are different
measurements; data paths (`data.root`, `data.dir`) stay too (a different path may be other
data). Where the runs of one table differ in such a key, the tables say so.

The table's column key (ViT: `acdc.sparsity`; GPT-2: `prune.sparsities`, each run fills
every column it pruned at) and the optimizer's keys (`optimizer.*`) are not part of a row's
*experiment*: rows of one experiment differ only in the optimizer, and only such rows are
compared with each other ("Against the paper's claims"). Where runs of one data set and
model form several experiments, each row is labelled with the keys in which they differ
(`setting`), and rows of one optimizer name with differing optimizer keys add those keys to
the optimizer label.

Written into `--out`:

* `tables.md`: both tables in markdown (also printed), the comparison with the paper's
  claims (`results/paper/claims.md`), failed and skipped runs, and the list of runs;
* `vit_acdc.{csv,tex}`: the DeiT/ViT AC/DC table, top-1 (%) of the final sparse model;
  rows model x setting x optimizer, columns the AC/DC sparsity; the paper's number beside
  ours where `results/paper/deit_imagenet_acdc.csv` has it (ImageNet-1k runs of the same
  timm model);
* `gpt2_pruning.{csv,tex}`: the GPT-2 table, validation perplexity after one-shot magnitude
  pruning; columns the pruning sparsity (the paper states no GPT-2 numbers, only claims);
* `failed_runs.csv` (when there are any): one line per failed run with its signature;
* `accuracy_vs_sparsity.png`, `perplexity_vs_sparsity.png`: per row, the mean, with error
  bars of ± one sample std where n > 1 (none where n = 1), n in the legend;
* `weight_distribution.png`: log10|w| of the prunable weights, AdamW vs HAM vs HORST, from
  the first of these a run folder holds: `weight_histogram.json` (``{"counts": [...],
  "edges": [...]}`` of log10|w|, edges one longer), the `weights/log10_abs_*` records of
  `metrics.jsonl` (the ViT pipeline logs one per epoch; the last one of a dense epoch is
  used, before AC/DC's final pruning), or the newest checkpoint
  (`ckpt_*.pt`, loaded with ``weights_only=True``; the prunable matrices are found by the
  run's pruning preset). Runs with none of these are left out of that figure, with a note.

Cells show the mean ± sample std over seeds, `71.00 ± 1.41`; one run shows its value, `65.00`
(no "± 0.00"); the last column, `n`, counts the runs of each cell (`2`, or per column where
they differ: `2, 1`); a run whose metric is not finite counts in `diverged`.
The CSV files are tidy (one line per cell) for further processing.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAPER_CSV = REPO / "results" / "paper" / "deit_imagenet_acdc.csv"
SUMMARY = "summary.json"
FAILED = "failed.json"
CONFIG = "config.yaml"
HISTOGRAM_FILE = "weight_histogram.json"
OPTIMIZER_ORDER = ("adamw", "ham", "horst")
IMAGENET_CLASSES = 1000

# Not part of the experiment signature (see the module docstring): prefixes of dotted keys.
EXCLUDED_KEYS = ("seed", "logging", "resume", "hydra")
RUN_FOLDER_KEYS = ("run_dir", "output_dir", "out_dir")  # excluded wherever they appear
NO_EFFECT_KEYS = (
    "data.num_workers",
    "data.pin_memory",
    "cpu_threads",
    "train.log_interval",
    "train.checkpoint_interval",
    "train.keep_checkpoints",
    "train.peak_tflops",
)
COLUMN_KEYS = {"vit": ("acdc.sparsity",), "gpt2": ("prune.sparsities",)}


class NoRunsError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------- runs


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = tuple(value) if isinstance(value, list) else value


def _excluded(key: str) -> bool:
    parts = key.split(".")
    return (
        any(key == p or key.startswith(p + ".") for p in EXCLUDED_KEYS + NO_EFFECT_KEYS)
        or any(part in RUN_FOLDER_KEYS for part in parts)
    )


def _summary_settings(s: dict[str, Any]) -> dict[str, Any]:
    """For folders without config.yaml: the settings summary.json records (not its results)."""
    t = s.get("train", {})
    model = {k: v for k, v in s.get("model", {}).items() if k not in ("parameters", "prunable_parameters")}
    if s.get("pipeline") == "gpt2":
        return {
            "model": model,
            "optimizer": s.get("optimizer", {}),
            "data": {"name": s.get("data", {}).get("name")},
            "train": {k: t.get(k) for k in ("steps", "batch_size", "context")},
            "prune": {k: s.get("pruning", {}).get(k) for k in ("scope", "preset")},
        }
    acdc = {k: v for k, v in s.get("acdc", {}).items() if k not in ("prune_epochs", "restore_epochs")}
    return {
        "model": model,
        "optimizer": s.get("optimizer", {}),
        "data": {k: s.get("data", {}).get(k) for k in ("name", "root", "num_classes")},
        "train": {k: t.get(k) for k in ("epochs", "batch_size")},
        "acdc": acdc,
    }


@dataclass
class Run:
    """A run folder: `summary` is summary.json (finished) or failed.json (failed)."""

    folder: Path
    summary: dict[str, Any]
    config: dict[str, Any] | None = None  # config.yaml (failed runs: also failed.json's config)
    status: str = "finished"

    @property
    def pipeline(self) -> str:
        return self.summary["pipeline"]

    @property
    def seed(self) -> Any:
        if self.config is not None and "seed" in self.config:
            return self.config["seed"]
        return self.summary.get("seed")

    @cached_property
    def signature(self) -> dict[str, Any]:
        """The experiment signature: flattened config minus the excluded keys."""
        flat: dict[str, Any] = {}
        _flatten("", self.config if self.config is not None else _summary_settings(self.summary), flat)
        return {k: v for k, v in flat.items() if not _excluded(k)}

    @property
    def experiment(self) -> dict[str, Any]:
        """The signature minus the optimizer and the table's column key."""
        columns = {k for keys in COLUMN_KEYS.values() for k in keys}
        return {k: v for k, v in self.signature.items() if not k.startswith("optimizer.") and k not in columns}

    @property
    def optimizer(self) -> dict[str, Any]:
        if self.config is not None:
            return self.config.get("optimizer", {})
        return self.summary.get("optimizer", {})


@dataclass
class Found:
    runs: list[Run] = field(default_factory=list)  # finished
    failed: list[Run] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # (folder or file, why)


def _read(path: Path) -> tuple[Any, str | None]:
    try:
        text = path.read_text()
        return (yaml.safe_load(text) if path.suffix == ".yaml" else json.loads(text)), None
    except (OSError, json.JSONDecodeError, yaml.YAMLError) as error:
        return None, f"{path.name} unreadable ({str(error).splitlines()[0]})"


def scan(dirs: Sequence[str | Path]) -> Found:
    """Every run folder below `dirs` (one holding summary.json, failed.json or config.yaml)."""
    missing = [str(d) for d in dirs if not Path(d).is_dir()]
    if missing:
        raise NoRunsError(f"no such folder: {', '.join(missing)}")
    folders: list[Path] = []
    seen: set[Path] = set()
    for d in dirs:
        for name in (SUMMARY, FAILED, CONFIG):
            for path in Path(d).rglob(name):
                folder = path.parent.resolve()
                hidden = any(part.startswith(".") for part in path.relative_to(d).parts[:-1])  # .hydra/, .submitit/
                if folder not in seen and not hidden:
                    seen.add(folder)
                    folders.append(path.parent)
    found = Found()
    for folder in sorted(folders):
        config, why = (None, None)
        if (folder / CONFIG).is_file():
            config, why = _read(folder / CONFIG)
            if not isinstance(config, dict):
                config = None
        for name, status in ((SUMMARY, "finished"), (FAILED, "failed")):
            if (folder / name).is_file():
                data, why = _read(folder / name)
                if why is None and not (isinstance(data, dict) and data.get("pipeline") in ("gpt2", "vit")):
                    why = f"{name} is not a train_gpt2.py/train_vit.py record (no pipeline key)"
                if why is not None:
                    found.skipped.append((folder, why))
                    break
                if status == "failed":
                    config = data.get("config") if isinstance(data.get("config"), dict) else config
                (found.runs if status == "finished" else found.failed).append(Run(folder, data, config, status))
                break
        else:
            if why is None:
                why = f"unfinished: {CONFIG} but no {SUMMARY} or {FAILED} (still running, killed, or preempted)"
            found.skipped.append((folder, why))
    for folder, why in found.skipped:
        print(f"note: skipped {folder}: {why}", file=sys.stderr)
    return found


def find_runs(dirs: Sequence[str | Path]) -> list[Run]:
    """Every finished run (one holding summary.json) below `dirs`, in path order."""
    runs = scan(dirs).runs
    if not runs:
        raise NoRunsError(_nothing(dirs))
    return runs


def _nothing(dirs: Sequence[str | Path]) -> str:
    return (
        f"no {SUMMARY} found under {', '.join(map(str, dirs))}: a run writes it when it finishes "
        "(python train_gpt2.py / python train_vit.py, or make demo); pass the folders that hold the runs"
    )


# ------------------------------------------------------------------------- row labels


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "[" + ",".join(_fmt(v) for v in value) + "]"
    return str(value)


def optimizer_name(opt: dict[str, Any]) -> str:
    """The optimizer's name, HORST's ablation order as `horst-sm`: a different method, so it
    gets neither HORST's paper numbers nor a line against the paper's claims about HORST."""
    name = opt["name"]
    if name == "horst" and opt.get("order", "ms") != "ms":
        name = f"horst-{opt['order']}"
    return name


def optimizer_label(opt: dict[str, Any]) -> str:
    """`adamw`, `ham (alpha=200, beta=0.001)`, `horst (alpha=10, beta=0.1)`; HORST's ablation
    order reads `horst-sm (...)`."""
    name = optimizer_name(opt)
    if "alpha" in opt:
        return f"{name} (alpha={_fmt(opt['alpha'])}, beta={_fmt(opt['beta'])})"
    return name


def model_label(summary: dict[str, Any]) -> str:
    """The model preset (summary.json's `preset`, a config's `name`), else its timm name or size."""
    model = summary["model"]
    if model.get("preset") or model.get("name"):
        return model.get("preset") or model["name"]
    if summary["pipeline"] == "vit" or "timm_name" in model:
        return model["timm_name"]
    return f"gpt2 {model['n_layer']}x{model['n_embd']}"


def run_model_label(run: Run) -> str:
    if run.status == "finished" or run.config is None:
        return model_label(run.summary)
    return model_label({"pipeline": run.pipeline, "model": run.config.get("model", {})})


def data_name(run: Run) -> str:
    source = run.config if run.config is not None else run.summary
    return str(source.get("data", {}).get("name"))


def differing(dicts: Sequence[dict[str, Any]]) -> list[str]:
    """Keys whose value (or presence) is not the same in all `dicts`, sorted."""
    keys = sorted({k for d in dicts for k in d})
    return [k for k in keys if len({repr(d.get(k, "<absent>")) for d in dicts}) > 1]


def _describe(d: dict[str, Any], keys: Sequence[str]) -> str:
    return ", ".join(f"{k}={_fmt(d.get(k, '<absent>'))}" for k in keys)


def _key(d: dict[str, Any]) -> str:
    return json.dumps(sorted(d.items(), key=lambda kv: kv[0]), default=repr)


# ------------------------------------------------------------------------------- cells


@dataclass
class Table:
    key: str  # vit_acdc | gpt2_pruning
    title: str
    metric: str  # the CSV's name for the values
    note: str
    cells: pd.DataFrame  # tidy: one line per (row, sparsity); see CELL_COLUMNS
    lower_is_better: bool = False
    decimals: int = 2

    @property
    def sparsities(self) -> list[float]:
        return sorted(self.cells["sparsity"].unique())

    @property
    def has_settings(self) -> bool:
        return bool((self.cells["setting"] != "").any())


ROW_KEYS = ["data", "model", "setting", "optimizer"]
CELL_COLUMNS = [*ROW_KEYS, "optimizer_name", "alpha", "beta", "sparsity", "metric", "mean", "std", "n",
                "diverged", "seeds", "paper", "runs"]  # fmt: skip


def _values(run: Run) -> list[tuple[float, float | None]]:
    """(sparsity, value) pairs of one run: its AC/DC top-1 in %, or its perplexity at each
    one-shot sparsity."""
    s = run.summary
    if run.pipeline == "vit":
        top1 = s.get("top1")
        return [(float(s["target_sparsity"]), None if top1 is None else 100.0 * top1)]
    if "pruning" in s:  # the paper's protocol: unstructured magnitude pruning (other methods' rows aside)
        return [(float(r["sparsity"]), r["ppl"]) for r in s["pruning"]["results"] if is_paper_row(r)]
    return [(float(k), v) for k, v in s["ppl"].items()]


def is_paper_row(result: dict) -> bool:
    """A one-shot result of the paper's protocol (unstructured magnitude pruning), or the dense
    model it starts from (method `none`, pattern `dense`: the 0 % column); rows of runs from
    before `prune.methods` existed have no method and are such rows."""
    if result.get("pattern") == "dense":
        return True
    return result.get("method", "magnitude") == "magnitude" and result.get("pattern", "unstructured") == "unstructured"


def is_imagenet(run: Run) -> bool:
    return run.pipeline == "vit" and run.summary["data"].get("num_classes") == IMAGENET_CLASSES


def label_rows(runs: list[Run]) -> dict[Path, tuple[str, str, str, str]]:
    """(data, model, setting, optimizer label) of each run (by folder). `setting` names the
    keys in which the experiments of one (data, model) differ; the optimizer label adds the
    optimizer keys in which rows of one experiment and optimizer label differ."""
    labels: dict[Path, tuple[str, str, str, str]] = {}
    panels: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for run in runs:
        panels[(data_name(run), run_model_label(run))].append(run)
    for (data, model), members in panels.items():
        experiments = {_key(r.experiment): r.experiment for r in members}
        keys = differing(list(experiments.values()))
        same_label: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
        for run in members:
            opt = {f"optimizer.{k}": v for k, v in _flat_optimizer(run).items()}
            same_label[(_key(run.experiment), optimizer_label(run.optimizer))][_key(opt)] = opt
        for run in members:
            setting = _describe(run.experiment, keys)
            base = optimizer_label(run.optimizer)
            opts = same_label[(_key(run.experiment), base)]
            extra = differing(list(opts.values()))
            opt = {f"optimizer.{k}": v for k, v in _flat_optimizer(run).items()}
            labels[run.folder] = (data, model, setting, f"{base} [{_describe(opt, extra)}]" if extra else base)
    return labels


def _flat_optimizer(run: Run) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    _flatten("", run.optimizer, flat)
    return flat


def tidy_values(runs: list[Run]) -> pd.DataFrame:
    """One line per (run, sparsity) with the run's row labels."""
    labels = label_rows(runs)
    records = []
    for run in runs:
        data, model, setting, optimizer = labels[run.folder]
        opt = run.optimizer
        for sparsity, value in _values(run):
            records.append({
                "data": data, "model": model, "setting": setting, "optimizer": optimizer,
                "optimizer_name": optimizer_name(opt), "alpha": opt.get("alpha"), "beta": opt.get("beta"),
                "sparsity": sparsity, "value": math.nan if value is None else float(value), "seed": run.seed,
                "folder": run.folder, "timm_name": run.summary["model"].get("timm_name"), "imagenet": is_imagenet(run),
            })  # fmt: skip
    return pd.DataFrame.from_records(records)


def aggregate(values: pd.DataFrame, metric: str, *, relative_to: Path) -> pd.DataFrame:
    """Mean, sample std (NaN for one run), n over the finite values of each (row, sparsity)."""
    values = values.assign(finite=values["value"].where(values["value"].map(math.isfinite)))
    grouped = values.groupby([*ROW_KEYS, "sparsity"], sort=False, dropna=False)
    cells = grouped.agg(
        optimizer_name=("optimizer_name", "first"),
        alpha=("alpha", "first"),
        beta=("beta", "first"),
        mean=("finite", "mean"),
        std=("finite", lambda v: v.std(ddof=1)),
        n=("finite", "count"),
        runs_total=("value", "size"),
        seeds=("seed", lambda v: ";".join(map(str, v))),
        runs=("folder", lambda v: ";".join(_relative(p, relative_to) for p in v)),
        timm_name=("timm_name", "first"),
        imagenet=("imagenet", "first"),
    ).reset_index()
    cells["diverged"] = cells["runs_total"] - cells["n"]
    cells["metric"] = metric
    cells["paper"] = math.nan
    for row in cells.itertuples():
        seeds = row.seeds.split(";")
        if len(set(seeds)) < len(seeds):
            print(f"note: {row.model} {row.optimizer} {row.setting} at {_pct(row.sparsity)} has several runs with the "
                  f"same seed ({row.runs.replace(';', ', ')}); all are averaged", file=sys.stderr)  # fmt: skip
    return cells


def add_paper(cells: pd.DataFrame, paper: dict[tuple[str, str, float], float]) -> pd.DataFrame:
    """The paper's numbers beside ImageNet-1k rows of the paper's timm model, and a row for each
    paper number of such a model (and setting) whose optimizer we did not run."""
    if not paper or cells.empty:
        return cells
    cells = cells.copy()
    for i, row in cells.iterrows():
        if row["imagenet"]:
            cells.at[i, "paper"] = paper.get((row["timm_name"], row["optimizer_name"], row["sparsity"]), math.nan)
    extra = []
    imagenet = cells[cells["imagenet"].astype(bool)]
    for (data, model, setting, timm_name), rows in imagenet.groupby(["data", "model", "setting", "timm_name"], sort=False):
        ran = set(rows["optimizer_name"])
        for (paper_model, optimizer, sparsity), top1 in paper.items():
            if paper_model == timm_name and optimizer not in ran:
                extra.append({"data": data, "model": model, "setting": setting, "optimizer": optimizer,
                              "optimizer_name": optimizer, "sparsity": sparsity, "metric": rows["metric"].iloc[0],
                              "mean": math.nan, "std": math.nan, "n": 0, "diverged": 0, "seeds": "", "runs": "",
                              "paper": top1, "timm_name": timm_name, "imagenet": True})  # fmt: skip
    if extra:
        cells = pd.concat([cells, pd.DataFrame.from_records(extra)], ignore_index=True)
    return cells


def _natural(text: str) -> tuple:
    """`train.epochs=6` before `train.epochs=40`."""
    return tuple((0, float(part), "") if re.fullmatch(r"\d+(\.\d+)?", part) else (1, 0.0, part)
                 for part in re.split(r"(\d+(?:\.\d+)?)", text))  # fmt: skip


def _order(cells: pd.DataFrame) -> pd.DataFrame:
    rank = cells["optimizer_name"].map(lambda n: OPTIMIZER_ORDER.index(n) if n in OPTIMIZER_ORDER else len(OPTIMIZER_ORDER))
    settings = {s: i for i, s in enumerate(sorted(set(cells["setting"]), key=_natural))}
    return (
        cells.assign(_rank=rank, _setting=cells["setting"].map(settings))
        .sort_values(["data", "model", "_setting", "_rank", "optimizer", "sparsity"], kind="stable")
        .drop(columns=["_rank", "_setting"])
        .reset_index(drop=True)
    )


def load_paper(path: Path) -> dict[tuple[str, str, float], float]:
    """{(timm model, optimizer, sparsity): top-1 %} from the paper's CSV (empty if absent)."""
    if not path.is_file():
        print(f"note: {path} not found; no paper numbers in the tables", file=sys.stderr)
        return {}
    frame = pd.read_csv(path)
    return {(r.model, r.optimizer, float(r.sparsity)): float(r.top1) for r in frame.itertuples()}


def build_tables(runs: list[Run], paper: dict[tuple[str, str, float], float], *, relative_to: Path | None = None) -> list[Table]:
    relative_to = relative_to or Path.cwd()
    tables = []
    vit = [r for r in runs if r.pipeline == "vit"]
    if vit:
        cells = add_paper(aggregate(tidy_values(vit), "top1_percent", relative_to=relative_to), paper)
        tables.append(
            Table(
                "vit_acdc",
                "ViT/DeiT under AC/DC: top-1 accuracy (%) of the final sparse model",
                "top1_percent",
                "Columns: AC/DC target sparsity of the prunable block matrices. Higher is better. "
                "Paper numbers (in parentheses) exist only for DeiT on ImageNet-1k "
                "(results/paper/deit_imagenet_acdc.csv).",
                _order(cells),
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
                _order(aggregate(tidy_values(gpt2), "val_perplexity", relative_to=relative_to)),
                lower_is_better=True,
            )
        )
    return tables


# ---------------------------------------------------------------------------- rendering


def _pct(sparsity: float) -> str:
    return f"{100 * sparsity:g} %"


def cell_text(cell: Any, decimals: int, *, pm: str = "±", dash: str = "–") -> str:
    """`71.00 ± 1.41` (n > 1), `65.00` (one run: no std), `–`; ` [diverged 2]` where runs had
    a non-finite metric; ` (70.50)` adds the paper's number. The row's `n` column counts runs."""
    if cell.n > 1:
        ours = f"{cell.mean:.{decimals}f} {pm} {cell.std:.{decimals}f}"
    elif cell.n == 1:
        ours = f"{cell.mean:.{decimals}f}"
    else:
        ours = dash
    if cell.diverged:
        ours += f" [diverged {cell.diverged}]"
    if not pd.isna(cell.paper):
        ours += f" ({cell.paper:.2f})"
    return ours


def _n_text(counts: pd.Series, dash: str) -> str:
    """A row's run counts: `2` where every cell has two, else per column (`2, 1, –`)."""
    ran = {int(n) for n in counts if not pd.isna(n) and n > 0}
    if len(ran) <= 1:
        return str(ran.pop()) if ran else dash
    return ", ".join(dash if pd.isna(n) or n == 0 else str(int(n)) for n in counts)


def wide(table: Table, **text: Any) -> pd.DataFrame:
    """Rows x sparsity columns of cell texts (the rows in the table's order), then `n`."""
    dash = text.get("dash", "–")
    cells = table.cells.assign(text=[cell_text(c, table.decimals, **text) for c in table.cells.itertuples()])
    frame = cells.pivot(index=ROW_KEYS, columns="sparsity", values="text").fillna(dash)
    counts = cells.pivot(index=ROW_KEYS, columns="sparsity", values="n")
    order = pd.MultiIndex.from_tuples(list(dict.fromkeys(map(tuple, cells[ROW_KEYS].itertuples(index=False)))), names=ROW_KEYS)
    frame = frame.reindex(order)[table.sparsities]
    frame.columns = [_pct(s) for s in frame.columns]
    frame["n"] = [_n_text(row, dash) for _, row in counts.reindex(order)[table.sparsities].iterrows()]
    frame = frame.reset_index()
    return frame if table.has_settings else frame.drop(columns="setting")


def _markdown_frame(frame: pd.DataFrame, right: int) -> list[str]:
    left = len(frame.columns) - right
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "|".join(["---"] * left + ["---:"] * right) + "|"]
    lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in frame.itertuples(index=False)]
    return lines


def markdown(table: Table) -> str:
    frame = wide(table)
    lines = [
        f"### {table.title}",
        "",
        "Cells: ours, mean ± sample std over seeds (one run: its value, no std); n: runs per cell; (paper) "
        "where the paper states the number. " + ("Rows of one data set and model whose experiments differ name the differing config "
                          "keys under `setting`. " if table.has_settings else "") + table.note,
        "",
        *_markdown_frame(frame, len(table.sparsities) + 1),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


_LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}  # fmt: skip


def latex_escape(text: str) -> str:
    return "".join(_LATEX_ESCAPES.get(c, c) for c in text)


def latex(table: Table) -> str:
    """A booktabs table (\\usepackage{booktabs}), by pandas' to_latex."""
    frame = wide(table, pm="PLUSMINUS", dash="--")
    frame = frame.map(lambda v: latex_escape(str(v)).replace("PLUSMINUS", r"$\pm$"))
    frame.columns = [latex_escape(c.capitalize() if c in ROW_KEYS else c) for c in frame.columns]
    caption = (
        latex_escape(table.title) + r". Mean $\pm$ sample std over seeds (one run: its value, no std); "
        "n: runs per cell; (paper) where the paper states the number. " + latex_escape(table.note)
    )
    left = len(frame.columns) - len(table.sparsities) - 1
    text = frame.to_latex(
        index=False,
        escape=False,
        column_format="l" * left + "r" * (len(table.sparsities) + 1),
        caption=caption,
        label="tab:" + table.key.replace("_", "-"),
        position="t",
    )
    return text.replace("\\begin{table}[t]\n", "\\begin{table}[t]\n\\centering\n", 1)


def write_csv(table: Table, path: Path) -> None:
    cells = table.cells[CELL_COLUMNS].assign(
        mean=table.cells["mean"].map(lambda v: "" if pd.isna(v) else repr(float(v))),
        std=table.cells["std"].map(lambda v: "" if pd.isna(v) else repr(float(v))),
        paper=table.cells["paper"].map(lambda v: "" if pd.isna(v) else f"{v:g}"),
    )
    cells.to_csv(path, index=False)


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------- claims (in words)


def claims(tables: list[Table]) -> list[str]:
    """Each HORST row against each AdamW/HAM row of the same data, model and experiment: the
    paper's claims 1 (ViT: higher accuracy) and 2 (GPT-2: lower perplexity, widening gap), read
    off our means. Rows of different experiments are never compared; where a HORST row has no
    baseline of its own experiment, a line says so and names the keys that differ."""
    lines = []
    for table in tables:
        lower = table.lower_is_better
        ran = table.cells[table.cells["n"] > 0]
        for (data, model), panel in ran.groupby(["data", "model"], sort=False):
            for setting, rows in panel.groupby("setting", sort=False):
                where = f"{table.key} {data}/{model}" + (f" [{setting}]" if setting else "")
                means = rows.pivot_table(index="optimizer", columns="sparsity", values="mean", sort=False)
                names = rows.groupby("optimizer", sort=False)["optimizer_name"].first()
                horst_rows = [o for o, n in names.items() if n == "horst"]
                baselines = [o for n in ("adamw", "ham") for o, m in names.items() if m == n]
                if horst_rows and not baselines:
                    others = sorted(set(panel["setting"]) - {setting})
                    lines.append(f"- {where}: HORST has no AdamW or HAM run of the same experiment; not compared"
                                 + (f" with the runs of {'; '.join(others)}" if others else "") + ".")  # fmt: skip
                for horst in horst_rows:
                    for baseline in baselines:
                        common = [s for s in means.columns if not pd.isna(means.at[horst, s]) and not pd.isna(means.at[baseline, s])]
                        if not common:
                            continue
                        gaps = {s: means.at[baseline, s] - means.at[horst, s] for s in common}  # > 0: HORST better
                        if not lower:
                            gaps = {s: -g for s, g in gaps.items()}
                        wins = sum(g > 0 for g in gaps.values())
                        unit = "perplexity" if lower else "top-1 points"
                        detail = ", ".join(f"{_pct(s)}: {gaps[s]:+.2f}" for s in common)
                        line = (f"- {where}: {horst} better than {baseline} at {wins} of {len(common)} sparsities "
                                f"(HORST's advantage in {unit}: {detail})")  # fmt: skip
                        if lower and len(common) > 1:
                            widens = gaps[common[-1]] > gaps[common[0]]
                            line += f"; the gap {'widens' if widens else 'does not widen'} from {_pct(common[0])} to {_pct(common[-1])}"
                        lines.append(line + ".")
    return lines


def experiments_note(tables: list[Table], runs: list[Run]) -> list[str]:
    """Where the runs of one data set and model form several experiments: the keys that differ."""
    lines = []
    for table in tables:
        pipeline = "vit" if table.key == "vit_acdc" else "gpt2"
        for (data, model), panel in table.cells.groupby(["data", "model"], sort=False):
            settings = [s for s in dict.fromkeys(panel["setting"]) if s]
            if settings:
                members = [r for r in runs if r.pipeline == pipeline and (data_name(r), run_model_label(r)) == (data, model)]
                keys = differing([r.experiment for r in members])
                lines.append(f"- {table.key} {data}/{model}: {len(settings)} experiments, differing in "
                             f"{', '.join(f'`{k}`' for k in keys)}; averaged and compared only within one.")  # fmt: skip
    return lines


# ---------------------------------------------------------------------------- failed runs


def failed_frame(failed: list[Run], *, relative_to: Path) -> pd.DataFrame:
    records = []
    for run in failed:
        s = run.summary
        column = {k: v for k, v in run.signature.items() if k in COLUMN_KEYS.get(run.pipeline, ())}
        records.append({
            "folder": _relative(run.folder, relative_to), "pipeline": run.pipeline, "data": data_name(run),
            "model": run_model_label(run), "optimizer": optimizer_label(run.optimizer) if run.optimizer else "?",
            "sparsity": _describe(column, sorted(column)), "seed": run.seed, "exit_code": s.get("exit_code"),
            "step": s.get("step"), "reason": str(s.get("reason", "")).splitlines()[0] if s.get("reason") else "",
            "git_commit": _short_commit(s.get("git_commit")),
            "signature": json.dumps(run.signature, default=repr, sort_keys=True),
        })  # fmt: skip
    return pd.DataFrame.from_records(records)


def failed_section(frame: pd.DataFrame) -> str:
    if frame.empty:
        return ""
    shown = frame.drop(columns=["signature", "git_commit"]).fillna("")
    return (
        f"\n### Failed runs ({len(frame)})\n\n"
        "Not in the tables above; each ended with `failed.json` (exit code, reason, step; its full "
        "signature is in failed_runs.csv).\n\n" + "\n".join(_markdown_frame(shown, 0)) + "\n"
    )


# ---------------------------------------------------------------------------- figures


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _row_name(optimizer: str, setting: str) -> str:
    return f"{optimizer} [{setting}]" if setting else optimizer


def _plain_log_ticks(ax, low: float, high: float) -> None:
    """A log axis labelled with plain numbers (20, 50, 100, 200, ...), not 2.2x10^2."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    ticks = [m * 10**e for e in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1) for m in (1, 2, 5)]
    inside = [t for t in ticks if low <= t <= high]
    if len(inside) < 3:  # a narrow range: finer steps
        ticks = [m * 10**e for e in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
                 for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8)]  # fmt: skip
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(low, high)


def metric_figure(table: Table, path: Path, *, ylabel: str, log_y: bool = False, min_span: float = 10.0) -> None:
    """Per (data, model) panel, one line per row: mean per sparsity; error bars (± one sample
    std) only where n > 1; the paper's numbers as crosses. Linear accuracy axes span at least
    `min_span` points, so within-noise gaps do not fill the plot; perplexity on a log axis with
    plain tick labels. Legends below the axes."""
    plt = _pyplot()
    panels = list(table.cells.groupby(["data", "model"], sort=False))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 4), squeeze=False)
    for ax, ((data, model), cells) in zip(axes[0], panels):
        shown: list[float] = []
        for i, ((optimizer, setting), row) in enumerate(cells.groupby(["optimizer", "setting"], sort=False)):
            color = f"C{i % 10}"
            ran = row[row["n"] > 0].sort_values("sparsity")
            if not ran.empty:
                ns = sorted(set(ran["n"]))
                label = f"{_row_name(optimizer, setting)}, n={'/'.join(map(str, ns))}"
                ax.plot(100 * ran["sparsity"], ran["mean"], "-o", color=color, label=label)
                spread = ran[ran["n"] > 1]
                if not spread.empty:
                    ax.errorbar(100 * spread["sparsity"], spread["mean"], yerr=spread["std"], fmt="none", ecolor=color, capsize=4)
                    shown += list(spread["mean"] - spread["std"]) + list(spread["mean"] + spread["std"])
                shown += list(ran["mean"])
            paper = row[row["paper"].notna()].sort_values("sparsity")
            if not paper.empty:
                ax.plot(100 * paper["sparsity"], paper["paper"], "x", ms=9, mew=2, color=color,
                        label=f"{_row_name(row['optimizer_name'].iloc[0], setting)} (paper)")  # fmt: skip
                shown += list(paper["paper"])
        xs = 100 * cells["sparsity"]
        if xs.nunique() == 1:
            ax.set_xlim(xs.iloc[0] - 10, xs.iloc[0] + 10)
        ax.set_xticks(sorted(xs.unique()))
        finite = [v for v in shown if math.isfinite(v)]
        if finite:
            low, high = min(finite), max(finite)
            if log_y:
                ax.set_yscale("log")
                _plain_log_ticks(ax, low / 1.1, high * 1.1)
            else:
                pad = max(min_span - (high - low), 0.0) / 2 + 0.05 * (high - low)
                ax.set_ylim(max(low - pad, 0.0), min(high + pad, 100.0) if table.metric == "top1_percent" else high + pad)
        ax.set_title(f"{model} ({data})", fontsize=9)
        ax.set_xlabel("sparsity (%)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        # below the axes, clear of the data and of the next panel
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    fig.suptitle(table.title + "\nmean over seeds; error bars ± 1 sample std where n > 1", fontsize=9, y=1.04)
    fig.savefig(path, dpi=130, bbox_inches="tight")
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
    """log10|w| densities per optimizer, one panel per (pipeline, data, model, setting); for
    ViT the run at the highest sparsity. Returns notes (where each came from, median |w|)."""
    labels = label_rows(runs)
    panels: dict[tuple[str, str, str], dict[str, Run]] = defaultdict(dict)
    notes: list[str] = []
    for run in sorted(runs, key=lambda r: (str(r.summary.get("target_sparsity", 0)), str(r.seed), str(r.folder))):
        data, model, setting, label = labels[run.folder]
        key = (run.pipeline, data, model + (f" [{setting}]" if setting else ""))
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
        # below the axes: the legend never covers a peak
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    fig.suptitle("Weight-magnitude distribution: AdamW vs HAM vs HORST", fontsize=10, y=1.06)
    fig.savefig(path, dpi=130, bbox_inches="tight")
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
    found = scan(dirs)
    runs = found.runs
    if not runs and not found.failed:
        raise NoRunsError(_nothing(dirs) + "".join(f"; skipped {f}: {why}" for f, why in found.skipped))
    base = Path.cwd()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tables = build_tables(runs, load_paper(paper_csv), relative_to=base)
    sections = []
    files = []
    for table in tables:
        sections.append(markdown(table))
        (out / f"{table.key}.tex").write_text(latex(table))
        write_csv(table, out / f"{table.key}.csv")
        files.append(f"{table.key}.csv, {table.key}.tex")
    for table in tables:
        if table.key == "vit_acdc":
            metric_figure(table, out / "accuracy_vs_sparsity.png", ylabel="top-1 accuracy (%)")
            files.append("accuracy_vs_sparsity.png")
        else:
            metric_figure(table, out / "perplexity_vs_sparsity.png", ylabel="validation perplexity (log scale)", log_y=True)
            files.append("perplexity_vs_sparsity.png")
    notes = weight_figure(runs, out / "weight_distribution.png") if runs else []
    if (out / "weight_distribution.png").is_file() and not any(n.startswith("weight-distribution figure skipped") for n in notes):
        files.append("weight_distribution.png")
    for note in notes:
        if "left out" in note or "skipped" in note:
            print(f"note: {note}", file=sys.stderr)
    failed = failed_frame(found.failed, relative_to=base)
    if not failed.empty:
        failed.to_csv(out / "failed_runs.csv", index=False)
        files.append("failed_runs.csv")

    text = "\n".join(sections)
    settings = experiments_note(tables, runs)
    if settings:
        text += "\n### Experiments\n\n" + "\n".join(settings) + "\n"
    comparison = claims(tables)
    text += "\n### Against the paper's claims (our means; not a significance test)\n\n"
    text += "\n".join(comparison) if comparison else "- no HORST run with an AdamW or HAM run of the same experiment"
    text += "\n" + failed_section(failed)
    if found.skipped:
        text += f"\n### Skipped ({len(found.skipped)})\n\n" + "\n".join(
            f"- {_relative(f, base)}: {why}" for f, why in found.skipped) + "\n"  # fmt: skip
    if notes:
        text += "\n### Weight magnitudes\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    text += "\n### Files\n\n" + "\n".join(f"- {f}" for f in files)
    text += f"\n\n### Runs ({len(runs)})\n\n" + "\n".join(
        f"- {_relative(r.folder, base)}: {r.pipeline}, {model_label(r.summary)}, "
        f"{optimizer_label(r.summary['optimizer'])}, seed {r.seed}, commit {_short_commit(r.summary.get('git_commit'))}"
        for r in runs
    ) + "\n"  # fmt: skip
    (out / "tables.md").write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", help="folders searched recursively for summary.json / failed.json / config.yaml")
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
