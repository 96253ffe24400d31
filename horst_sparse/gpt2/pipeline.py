"""The GPT-2 pipeline as the registry knows it (horst_sparse.pipeline)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from horst_sparse.gpt2 import export
from horst_sparse.gpt2.config import register_configs, validate
from horst_sparse.gpt2.data import PREPARE_SLIMPAJAMA, load_split
from horst_sparse.gpt2.run import run
from horst_sparse.pipeline import Checks, Configs, Export, Pipeline, TuningScore
from horst_sparse.training.config import ConfigError

# The tuning score's rows: unstructured magnitude pruning at these sparsities, the model as it is used.
PRUNED_SPARSITIES = (0.5, 0.9)


def check_data(cfg: Any) -> None:
    """The tokenized splits exist (the embedded pydoc set is tokenized on first use)."""
    if cfg.data.name != "pydoc":
        for split in ("train", "val"):
            load_split(cfg.data.dir, split, prepare_command=PREPARE_SLIMPAJAMA.format(dir=cfg.data.dir))


def _number(r: Mapping[str, Any], metric: str) -> dict[str, Any]:
    dense = float(r["sparsity"]) == 0.0 or r.get("pattern") == "dense"
    return {
        "metric": metric,
        "method": "none" if dense else r.get("method", "magnitude"),
        "pattern": "dense" if dense else r.get("pattern", "unstructured"),
        "sparsity": float(r["sparsity"]),
        "value": r.get("ppl"),
    }


def numbers(config: Mapping[str, Any], summary: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Perplexity of the dense model and after each one-shot pruning the run evaluated (a failed
    run: magnitude pruning at its sparsities, as planned); with prune.at_steps also each of those
    during training, as `ppl_curve` at its `step` (horst_sparse.analysis.runs: a curve point)."""
    if summary is None:
        results = [
            {"sparsity": s, "method": "magnitude", "pattern": "unstructured"} for s in config["prune"]["sparsities"]
        ]
        return [_number(r, "ppl") for r in results]
    curve = [{**_number(r, "ppl_curve"), "step": r["step"]} for r in summary["pruning"].get("curve", [])]
    return [_number(r, "ppl") for r in summary["pruning"]["results"]] + curve


def pruned_perplexity(summary: Mapping[str, Any]) -> float:
    """The geometric mean of the validation perplexities after one-shot magnitude pruning at
    PRUNED_SPARSITIES' range (inf where one is not finite)."""
    low, high = PRUNED_SPARSITIES
    rows = [
        r
        for r in summary["pruning"]["results"]
        if r["method"] == "magnitude" and r["pattern"] == "unstructured" and low - 1e-9 <= r["sparsity"] <= high + 1e-9
    ]
    if not rows:
        raise ConfigError(f"prune.sparsities has no unstructured sparsity in [{low}, {high}]: nothing to score")
    ppls = [r["ppl"] for r in rows]  # summary.json writes a non-finite perplexity as null
    if not all(p is not None and 0 < p < math.inf for p in ppls):
        return math.inf
    return math.exp(sum(math.log(p) for p in ppls) / len(ppls))


PIPELINE = Pipeline(
    name="gpt2",
    run=run,
    configs=Configs(register_configs, lr_key="train.lr"),
    checks=Checks(config=validate, data=check_data),
    numbers=numbers,
    tuning=TuningScore(
        "geometric-mean validation perplexity after one-shot magnitude pruning at 50-90 %",
        "minimize",
        pruned_perplexity,
    ),
    export=Export(export.export_run, format="hf"),
)
