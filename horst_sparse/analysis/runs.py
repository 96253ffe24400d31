"""Runs into one tidy frame: a row per run x metric x (method, pattern, sparsity).

Two sources give the same frame. Run folders (`config.yaml`, then `summary.json` when the run
finished or `failed.json` when it failed, as `horst_sparse.training.run_log` writes them) give every column,
the run's config flattened into `config.<dotted key>` columns included. A study's record,
`runs.csv` (`write_record`), keeps the identity and numbers of each row without the config
columns: run folders need not outlive the machine they ran on, the record is committed.

Columns: `run` (its folder), `pipeline`, `data`, `model`, `arm` (the study's label the run
recorded; runs from before `arm` existed: the optimizer, `_sm` for HORST's order "sm"),
`optimizer` (the class that ran, checked against the name it recorded), `seed`, `eval_split`
(the split its numbers are measured on), `git_commit`, `signature` (a hash of the config
without the seed, the label, the table's column keys and `horst_sparse.training.no_effect.NO_EFFECT`:
runs with one signature are the seeds of one cell), `metric` (`top1` in %, `ppl`), `method`
(`acdc`; GPT-2: `none` for the dense model, `magnitude`, `wanda`), `pattern`, `sparsity`,
`value` (NaN where the run diverged), `wall_time_s`, `status` (`done`; from `failed.json`:
`diverged` (a non-finite loss, exit code 4), `cancelled` (by SLURM) or `failed`: their numbers are NaN;
record rows have none) and where the run recorded them, the machine it ran on: `host`, `cpu` and
`cpu_threads` (torch's intra-op threads).

A row with a `step` is a point of a curve measured during training (GPT-2's `prune.at_steps`: metric
`ppl_curve`, each pruned copy of the model as it was after `step` updates), not one of the run's final
numbers, which have none: horst_sparse.analysis.matched's `final_numbers` and `curve_points` keep them apart. The frame and the record
have the column where a run measured a curve.

A folder with `config.yaml` alone is unfinished (running, killed or preempted) unless its log shows a
non-finite loss; tuning trials (`tuning_trial`) are left out unless asked for.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from horst_sparse.analysis.matched import STEP, curve_points
from horst_sparse.analysis.tables import write_csv
from horst_sparse.paths import CONFIGS
from horst_sparse.training.no_effect import SIGNED_UNLESS_DEFAULT, no_effect

SUMMARY, FAILED, CONFIG = "summary.json", "failed.json", "config.yaml"
ARMS = CONFIGS / "experiment"  # an arm of a study is an experiment that names its `arm`
# Not in a signature besides NO_EFFECT: the replicate, the label, the table's column keys.
NOT_SIGNATURE = ("seed", "arm", "acdc.sparsity", "prune")
UNRECORDED = "unrecorded"  # the signature of a record row whose run's config was not recorded
# horst_sparse.training.runner.NON_FINITE_EXIT_CODE (importing it would import torch): a run that diverged
DIVERGED_EXIT_CODE = 4
# What one number of a cell is: a measurement (metric, method, pattern, sparsity) of a run of its
# settings at one seed; the same number measured by two runs of the same settings and seed is one
# replicate. The table's column keys (NOT_SIGNATURE's acdc.sparsity, prune) are the number's own keys,
# so runs that differ only in them (a sparsity sweep) measure different numbers and both count.
REPLICATE = [
    "pipeline",
    "data",
    "model",
    "arm",
    "signature",
    "eval_split",
    "seed",
    "metric",
    "method",
    "pattern",
    "sparsity",
]
RECORD_COLUMNS = [
    "run",
    "pipeline",
    "data",
    "model",
    "arm",
    "optimizer",
    "seed",
    "eval_split",
    "git_commit",
    "signature",
    "metric",
    "method",
    "pattern",
    "sparsity",
    "value",
    "wall_time_s",
]
# summary.json's environment; empty in records from before it (and `cpu` was the architecture only)
MACHINE_COLUMNS = ["host", "cpu", "cpu_capability", "cpu_threads", "reproducible_cpu", "gpu"]
# a study's protocol version and its registration's label (horst_sparse.study.protocol), where it has one
PROTOCOL_COLUMNS = ["protocol", "protocol_hash"]


class NoRunsError(RuntimeError):
    pass


def _with_step(keys: list[str], frame: pd.DataFrame) -> list[str]:
    """`keys` and, where the frame has curve points, their step: a number's identity."""
    return [*keys, STEP] if STEP in frame else keys


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists become tuples (hashable, comparable)."""
    if isinstance(value, dict) and (value or not prefix):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= flatten(item, f"{prefix}.{key}" if prefix else str(key))
        return out
    return {prefix: tuple(value) if isinstance(value, list) else value}


def signature(config: dict[str, Any]) -> dict[str, Any]:
    """The flattened config minus what changes no number and what tells the seeds of a cell apart,
    plus the keys of SIGNED_UNLESS_DEFAULT that are not at their default (a run made by engine=fast)."""
    flat = flatten(config)
    kept = {
        k: v
        for k, v in flat.items()
        if not no_effect(k) and not any(k == p or k.startswith(p + ".") for p in NOT_SIGNATURE)
    }
    return kept | {k: flat[k] for k, default in SIGNED_UNLESS_DEFAULT.items() if flat.get(k, default) != default}


def signature_hash(config: dict[str, Any]) -> str:
    text = json.dumps(sorted(signature(config).items()), default=repr)
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def optimizer_label(node: dict[str, Any]) -> str:
    """The optimizer's recorded name, refused (ValueError) where it is not the class that ran:
    `name` is the class's name in lower case, underscores aside (horst_sparse/training/optim.py)."""
    name, target = str(node.get("name")), str(node.get("_target_", ""))
    cls = target.rsplit(".", 1)[-1]
    if target and name.replace("_", "").lower() != cls.lower():
        raise ValueError(f"records optimizer.name={name} but ran {target}")
    return name


def arm_label(config: dict[str, Any], arms: Path = ARMS) -> str:
    """The arm the run recorded, checked against `configs/experiment/<arm>.yaml` where it exists (its
    optimizer and its literal optimizer values); runs from before arms: the optimizer, `_sm` for
    HORST's order "sm"."""
    optimizer = config.get("optimizer", {})
    name = optimizer_label(optimizer)
    arm = config.get("arm")
    if arm is None:
        return name + ("_sm" if optimizer.get("order", "ms") != "ms" else "")
    file = arms / f"{arm}.yaml"
    if file.is_file():
        spec = yaml.safe_load(file.read_text()) or {}
        chosen = [
            d["override /optimizer"]
            for d in spec.get("defaults", [])
            if isinstance(d, dict) and "override /optimizer" in d
        ]
        wrong = [f"optimizer {name} (the arm's is {chosen[0]})"] if chosen and chosen[0] != name else []
        recorded = flatten(optimizer)
        wrong += [
            f"optimizer.{k}={recorded.get(k)} (the arm sets {v})"
            for k, v in flatten(spec.get("optimizer", {})).items()
            if not (isinstance(v, str) and "${" in v) and recorded.get(k) != v
        ]
        if wrong:
            raise ValueError(f"records arm={arm} but ran {'; '.join(wrong)}")
    return str(arm)


def _model(pipeline: str, model: dict[str, Any]) -> str:
    return str(model.get("name") or model.get("preset") or model.get("timm_name") or pipeline)


def _values(record: dict[str, Any]) -> list[dict[str, Any]]:
    """(metric, method, pattern, sparsity, value) of a run's numbers, as its pipeline wrote them
    into summary.json (a failed run's failed.json: value None, NaN here; `status` says why)."""
    if "numbers" in record:
        return [
            {
                **row,
                "sparsity": float(row["sparsity"]),
                "value": math.nan if row["value"] is None else float(row["value"]),
            }
            for row in record["numbers"]
        ]
    raise ValueError(
        "no `numbers` (written before 2026-12-02, when each pipeline began to record them): "
        "its numbers are in a study's runs.csv, or rerun it"
    )


SMALL_WEIGHT = 1e-3  # `weights_below_1e-3`: the share of prunable weights with |w| below this


def weight_histogram(folder: Path) -> tuple[list[float], list[float], str] | None:
    """(counts, edges, where from) of log10|w| over a run's non-zero prunable weights, or None:
    `weight_histogram.json` (GPT-2, after training), else the last histogram that
    `metrics.jsonl` (ViT: one per epoch) took with the model dense, i.e. before AC/DC's final
    pruning (the final sparse model keeps only the largest weights, whose shape says little)."""
    file = folder / "weight_histogram.json"
    if file.is_file():
        data = json.loads(file.read_text())
        return data["counts"], data["edges"], file.name
    metrics = folder / "metrics.jsonl"
    if not metrics.is_file():
        return None
    histograms, phases = [], {}
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        if "weights/log10_abs_counts" in record:
            histograms.append(record)
        if "val/phase" in record:
            phases[record["step"]] = record["val/phase"]
    dense = [h for h in histograms if phases.get(h["step"]) in ("dense", "decompressed")]
    if not histograms:
        return None
    chosen = (dense or histograms)[-1]
    where = f"metrics.jsonl, epoch {chosen.get('epoch', '?')} ({phases.get(chosen['step'], 'phase unknown')})"
    return chosen["weights/log10_abs_counts"], chosen["weights/log10_abs_edges"], where


def _weight_values(folder: Path) -> list[dict[str, Any]]:
    """GPT-2's trained weights as two numbers (claim 3): median log10|w| and the % below SMALL_WEIGHT."""
    if not (folder / "weight_histogram.json").is_file():
        return []
    counts, edges, _ = weight_histogram(folder)
    cumulative = np.concatenate([[0.0], np.cumsum(counts)]) / np.sum(counts)
    median = float(np.interp(0.5, cumulative, edges))
    below = 100.0 * float(np.interp(math.log10(SMALL_WEIGHT), edges, cumulative))
    dense = {"method": "none", "pattern": "dense", "sparsity": 0.0}
    return [
        {"metric": "weights_median_log10", **dense, "value": median},
        {"metric": "weights_below_1e-3", **dense, "value": below},
    ]


@dataclass
class Found:
    """What a scan of run folders found: the tidy frame of finished runs, and every folder left out with why."""

    frame: pd.DataFrame
    left_out: list[str] = field(default_factory=list)  # `folder: why`
    folders: dict[str, Path] = field(default_factory=dict)  # run -> its folder


def _read(path: Path) -> Any:
    text = path.read_text()
    return yaml.safe_load(text) if path.suffix == ".yaml" else json.loads(text)


def _shown(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


def tuning_trial(folder: Path, root: Path, config: Any) -> bool:
    """Whether a run folder found below `root` is a tuning trial (horst-sparse tune's, horst_sparse.tune)
    that was not asked for: below a `tuning/` folder inside `root` (horst-sparse tune's sweeps go to
    multirun/tuning/), its config sets `tune_over`, or the Hydra overrides of its folder or of one
    above it (a trial's cells are folders inside the trial's) select `hparams_search`. Never where
    `root` is itself inside a `tuning/` folder: the folder named is what is asked for."""
    if "tuning" in root.resolve().parts:
        return False
    inside = folder.relative_to(root).parts[:-1] if folder != root else ()
    if "tuning" in inside or (isinstance(config, dict) and config.get("tune_over")):
        return True
    for above in [folder, *folder.parents]:
        overrides = above / ".hydra" / "overrides.yaml"
        if overrides.is_file():
            try:
                chosen = yaml.safe_load(overrides.read_text()) or []
            except yaml.YAMLError:
                chosen = []
            if any(str(o).lstrip("+~").startswith("hparams_search") for o in chosen):
                return True
        if above == root:
            break
    return False


def _metrics(folder: Path) -> list[dict[str, Any]]:
    """The run log's whole records (a line cut short by a kill aside)."""
    path = folder / "metrics.jsonl"
    records = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _ended(record: dict[str, Any], folder: Path) -> tuple[str, str]:
    """(status, words) of a `failed.json`: diverged (a non-finite loss or weights: the runner's
    exit code 4), cancelled (SLURM cancelled the job, before it trained or on the way), or failed."""
    reason = str(record.get("reason") or "?").splitlines()[0]
    step = record.get("step")
    state = str(record.get("slurm_state") or "")
    if record.get("exit_code") == DIVERGED_EXIT_CODE:
        at = f" at step {step}" if step is not None and "step" not in reason else ""
        return (
            "diverged",
            f"diverged (non-finite loss, exit code {DIVERGED_EXIT_CODE}{at}: {reason}); counted in its cell as diverged",
        )
    if state.startswith("CANCELLED"):
        steps = [r["step"] for r in _metrics(folder) if "step" in r]
        when = f"after step {steps[-1]}" if steps else "before it trained"
        return "cancelled", f"cancelled ({state}, {when}); no number"
    return "failed", f"failed (exit code {record.get('exit_code')}: {reason}); no number"


def _unfinished(folder: Path) -> str:
    """Why a folder with config.yaml alone has no summary: diverged where the runner set a
    checkpoint aside as `*.diverged` (the weights that gave a non-finite loss: a single run that
    diverges writes no failed.json), else running, killed or preempted."""
    if any(folder.glob("*.diverged")):
        return f"diverged (a checkpoint set aside as *.diverged; no {FAILED}, so its cell does not count it)"
    return f"unfinished ({CONFIG} but no {SUMMARY} or {FAILED}: running, killed or preempted)"


def scan(dirs: Sequence[str | Path], *, base: Path | None = None, arms: Path = ARMS, tuning: bool = True) -> Found:
    """Every run folder below `dirs` (hidden folders, Hydra's `.hydra/` and submitit's, aside);
    arms are checked against their files in `arms`; tuning trials (`tuning_trial`) only where
    `tuning` (the tables leave them out unless asked)."""
    base = base or Path.cwd()
    missing = [str(d) for d in dirs if not Path(d).is_dir()]
    if missing:
        raise NoRunsError(f"no such folder: {', '.join(missing)}")
    roots: dict[Path, Path] = {}  # folder -> the first of `dirs` it was found in
    for d in map(Path, dirs):
        for name in (SUMMARY, FAILED, CONFIG):
            for p in d.rglob(name):
                if not any(part.startswith(".") for part in p.relative_to(d).parts[:-1]):
                    roots.setdefault(p.parent, d)
    rows: list[dict[str, Any]] = []
    found = Found(pd.DataFrame())
    trials = 0
    for folder in sorted(roots):
        run = _shown(folder, base)
        try:
            config = _read(folder / CONFIG) if (folder / CONFIG).is_file() else None
            if (folder / FAILED).is_file():  # its numbers are NaN: `status` says why
                summary = _read(folder / FAILED)
                config = summary.get("config") or config
                status, words = _ended(summary, folder)
                values = _values(summary)
            elif (folder / SUMMARY).is_file():
                summary, status, words = _read(folder / SUMMARY), "done", ""
                values = _values(summary) + _weight_values(folder)
            else:
                if not tuning and tuning_trial(folder, roots[folder], config):
                    trials += 1
                else:
                    found.left_out.append(f"{run}: {_unfinished(folder)}")
                continue
            if not tuning and tuning_trial(folder, roots[folder], config):
                trials += 1
                continue
            if words:
                found.left_out.append(f"{run}: {words}")
            if not isinstance(config, dict):
                found.left_out.append(f"{run}: no {CONFIG} (the record of what ran)")
                continue
            identity = {
                "run": run,
                "pipeline": summary["pipeline"],
                "data": str(config.get("data", {}).get("name")),
                "model": _model(summary["pipeline"], config.get("model", {})),
                "arm": arm_label(config, arms),
                "optimizer": optimizer_label(config.get("optimizer", {})),
                "seed": config.get("seed"),
                "eval_split": summary.get("eval_split", config.get("eval_split", "validation")),
                "git_commit": summary.get("git_commit"),
                "signature": signature_hash(config),
                "wall_time_s": summary.get("wall_time_s"),
                "status": status,
                **{key: (summary.get("environment") or {}).get(key) for key in MACHINE_COLUMNS},
            }
        except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as error:
            found.left_out.append(f"{run}: {error}")
            continue
        columns = {f"config.{k}": v for k, v in signature(config).items()}
        rows += [{**identity, **value, **columns} for value in values]
        found.folders[run] = folder
    if trials:
        found.left_out.append(
            f"{', '.join(map(str, dirs))}: {trials} tuning trial folder{'s' * (trials > 1)} (below a tuning/ "
            "folder, or setting tune_over or hparams_search) left out; --tuning includes them"
        )
    found.frame = pd.DataFrame.from_records(rows)
    for line in found.left_out:
        print(f"note: {line}", file=sys.stderr)
    return found


def read_runs(dirs: Sequence[str | Path], *, tuning: bool = True) -> Found:
    """`scan`, with an error naming what to pass where no run finished."""
    found = scan(dirs, tuning=tuning)
    if found.frame.empty:
        raise NoRunsError(
            f"no finished run (a folder with {SUMMARY} and {CONFIG}) under {', '.join(map(str, dirs))}"
            + "".join(f"; {why}" for why in found.left_out[:5])
        )
    return found


def results(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The rows a table counts and why the others are not: runs that failed or were cancelled
    measured nothing (a diverged run's NaN counts, as `[diverged k]`); a number that a run of the
    settings and seed of another measured too (`REPLICATE`: the same cell run twice, e.g. by two
    sweeps) is one replicate, not two: the newest run's (the last folder in path order, as Hydra's
    dated folders sort), finished where one is, counts. Record rows whose config was not recorded
    are kept as they are."""
    if "status" in frame:
        frame = frame[~frame["status"].isin(["failed", "cancelled"])]
    finished = frame.get("status", pd.Series("done", index=frame.index)).fillna("done") == "done"
    checked = frame.assign(_finished=finished)[frame["signature"] != UNRECORDED]
    ranked = checked.sort_values(["_finished", "run"], kind="stable")
    replicate = _with_step(REPLICATE, frame)
    newest = ranked.drop_duplicates(replicate, keep="last")
    superseded = ranked.drop(newest.index)
    notes = sorted(
        {
            f"{row.run}: the settings and seed ({row.seed}) of {kept}: one replicate, counted once (as the latter)"
            for row, kept in zip(
                superseded.itertuples(),
                superseded.merge(
                    newest[[*replicate, "run"]], on=replicate, how="left", suffixes=("", "_kept")
                ).run_kept,
            )
        }
    )
    return frame.drop(superseded.index).reset_index(drop=True), notes


def write_record(frame: pd.DataFrame, path: Path) -> None:
    """The study's record: the frame without its config columns, one line per run x number."""
    versioned = [c for c in PROTOCOL_COLUMNS if c in frame]
    step = [] if curve_points(frame).empty else [STEP]  # beside the number's other keys
    at = RECORD_COLUMNS.index("sparsity") + 1
    columns = versioned + RECORD_COLUMNS[:at] + step + RECORD_COLUMNS[at:] + [c for c in MACHINE_COLUMNS if c in frame]
    order = versioned[:1] + ["pipeline", "arm", "sparsity", "seed", "metric", "method", "pattern"] + step
    frame = frame.assign(protocol=frame["protocol"].astype("Int64")) if versioned else frame
    frame = frame.assign(step=frame[STEP].astype("Int64")) if step else frame
    write_csv(frame[columns].sort_values(order, kind="stable"), path)


def read_record(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Record files (`write_record`) into one frame; a run in two of them counts once."""
    frames = [
        pd.read_csv(p, keep_default_na=True, dtype={"git_commit": str, "signature": str, "protocol_hash": str})
        for p in paths
    ]
    frame = pd.concat(frames, ignore_index=True)
    # a run id names one run of one protocol version: two versions may reuse a folder name
    frame = frame.drop_duplicates(
        [c for c in ("protocol", "run", "metric", "method", "pattern", "sparsity", STEP) if c in frame]
    )
    missing = [c for c in RECORD_COLUMNS if c not in frame]
    if missing:
        raise NoRunsError(f"{', '.join(map(str, paths))}: not a study record (no column {', '.join(missing)})")
    return frame.reindex(columns=[*frame.columns, *(c for c in MACHINE_COLUMNS if c not in frame)]).reset_index(
        drop=True
    )
