"""One tuning trial, as the sweeper runs it: a pipeline's run (or one run per cell of `tune_over`) at
a tuning seed, scored on the validation split; the test split is never read."""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from horst_sparse.pipeline import Pipeline, TuningScore
from horst_sparse.pipeline import of as pipeline_of
from horst_sparse.training.config import RunError

TUNING_SEEDS_START = 100  # tuning seeds are 100, 101, ...; a study reports on seeds below (0-9)
EVAL_SPLIT = "validation"


class TuningError(RunError):
    """A tuning that cannot start or whose result cannot be used; one line, with the fix."""


def validation_score(pipeline: Pipeline, summary: Mapping[str, Any]) -> float:
    """The trial's score from its run summary (the pipeline's `tuning.score`); a failed run (no
    summary) and a non-finite score count as the worst."""
    metric = pipeline.tuning
    if not summary or summary.get("status") == "failed":
        return metric.worst()
    if summary.get("eval_split") != EVAL_SPLIT:
        raise TuningError(
            f"a tuning trial was scored on eval_split={summary.get('eval_split')}; tuning reads validation only"
        )
    try:
        score = metric.score(summary)
    except RunError as error:
        raise TuningError(str(error)) from None
    return score if score is not None and math.isfinite(score) else metric.worst()


def swept(tune_over: Any, prefix: str = "") -> dict[str, list]:
    """`tune_over` (a nested mapping of lists, e.g. {acdc: {sparsity: [0.7, 0.8, 0.9]}}) as {dotted key: values}."""
    if OmegaConf.is_config(tune_over):
        tune_over = OmegaConf.to_container(tune_over, resolve=True)
    out = {}
    for key, value in (tune_over or {}).items():
        if isinstance(value, Mapping):
            out |= swept(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, (list, tuple)) else [value]
    return out


def cells(tune_over: Any) -> list[dict[str, Any]]:
    """The runs of one trial: one per combination of `tune_over`'s values, as {dotted key: value}; [{}] without."""
    keys = swept(tune_over)
    return [dict(zip(keys, values)) for values in itertools.product(*keys.values())]


def cell_folder(cell: Mapping[str, Any]) -> str:
    """A cell's run folder inside its trial's: `acdc.sparsity=0.7` ('' for a trial of one run)."""
    return ",".join(f"{key}={value}" for key, value in cell.items())


def trial_score(metric: TuningScore, scores: Iterable[float]) -> float:
    """A trial's score: the mean of its cells' (the claims' endpoints, e.g. every reported
    sparsity); the worst where one of them is."""
    scores = list(scores)
    if any(score == metric.worst() for score in scores):
        return metric.worst()
    return float(np.mean(scores))


def trial(cfg) -> float:
    """A pipeline's run, or one run per cell of `tune_over`, as a trial: the sweeper gets its
    score. Module-level, so that submitit pickles it by reference."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import read_write

    from horst_sparse.training.runner import hydra_task

    pipeline = pipeline_of(cfg)
    runs = cells(cfg.get("tune_over"))
    if runs == [{}]:
        return validation_score(pipeline, hydra_task(pipeline.run, cfg))
    hydra_cfg = HydraConfig.get()
    folder = hydra_cfg.runtime.output_dir
    scores = []
    try:
        for cell in runs:  # one after another: the launcher runs trials side by side
            run_cfg = copy.deepcopy(cfg)
            for key, value in cell.items():
                OmegaConf.update(run_cfg, key, value, merge=False)
            with read_write(hydra_cfg):
                hydra_cfg.runtime.output_dir = str(Path(folder) / cell_folder(cell))
            scores.append(validation_score(pipeline, hydra_task(pipeline.run, run_cfg)))
    finally:
        with read_write(hydra_cfg):
            hydra_cfg.runtime.output_dir = folder
    return trial_score(pipeline.tuning, scores)
