"""The ViT pipeline as the registry knows it (horst_sparse.pipeline)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from horst_sparse.pipeline import Checks, Configs, Export, Pipeline, TuningScore
from horst_sparse.vit import export
from horst_sparse.vit.config import check_prunable_set, register_configs, validate
from horst_sparse.vit.data import check_imagefolder_root
from horst_sparse.vit.run import run


def check_data(cfg: Any) -> None:
    """ImageNet's folders exist and look like ImageFolder; the digits and MNIST-1D are generated."""
    if cfg.data.name == "imagefolder":
        check_imagefolder_root(cfg.data.root)


def check(cfg: Any, *, world_size: int) -> None:
    validate(cfg, world_size=world_size)
    check_prunable_set(cfg)


def numbers(config: Mapping[str, Any], summary: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Top-1 (%) of the final sparse model at the AC/DC target."""
    acdc = config["acdc"]
    top1 = None if summary is None or summary.get("top1") is None else 100.0 * summary["top1"]
    return [
        {
            "metric": "top1",
            "method": "acdc",
            "pattern": acdc.get("pattern", "unstructured"),
            "sparsity": float(acdc["sparsity"]),
            "value": top1,
        }
    ]


def validation_top1(summary: Mapping[str, Any]) -> float:
    return summary["top1"]


PIPELINE = Pipeline(
    name="vit",
    run=run,
    configs=Configs(register_configs, lr_key="train.base_lr"),
    checks=Checks(config=check, data=check_data),
    numbers=numbers,
    tuning=TuningScore("validation top-1 of the final sparse model", "maximize", validation_top1),
    export=Export(export.export_run, format="timm"),
)
