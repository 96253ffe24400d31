"""A third pipeline, the smallest that uses everything a pipeline declares (tests/test_toy_pipeline.py):
a linear classifier on seeded Gaussian blobs, trained with any optimizer inside `Run`, its accuracy on
`eval_split` as its number; its configs beside this file, as they go into a configs/ tree.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from horst_sparse.pipeline import Checks, Configs, Pipeline, TuningScore
from horst_sparse.training.config import RunConfig, check_known_keys, require, validate_run
from horst_sparse.training.optim import build_optimizer, check_optimizer
from horst_sparse.training.presets import register_help
from horst_sparse.training.runner import Run
from horst_sparse.training.schedule import build_lr_scheduler

CONFIGS = Path(__file__).with_name("configs")
SPLITS = ("validation", "test")


# ---- schemas (types only; the values are in configs/) ----------------------------------------
@dataclasses.dataclass
class ToyModelConfig:
    arch: str = MISSING  # toy
    name: str = MISSING
    bias: bool = MISSING


@dataclasses.dataclass
class BlobsConfig:
    name: str = MISSING  # blobs
    seed: int = MISSING  # the draw of the data, the same for every run seed
    classes: int = MISSING
    features: int = MISSING
    points: int = MISSING  # all splits together
    held_out: int = MISSING  # points in each of validation and test
    separation: float = MISSING  # the spread of the class centres (the noise has std 1)


@dataclasses.dataclass
class ToyTrainConfig:
    lr: float = MISSING
    min_lr: float = MISSING
    warmup_steps: int = MISSING
    max_steps: int = MISSING
    batch_size: int = MISSING
    checkpoint_interval: int = MISSING
    keep_checkpoints: int = MISSING


@dataclasses.dataclass
class ToyRunConfig(RunConfig):
    eval_split: str = MISSING  # validation | test
    data: BlobsConfig = MISSING
    train: ToyTrainConfig = MISSING


def register_configs() -> None:
    register_help("toy", "train a linear classifier on Gaussian blobs, report its accuracy")
    cs = ConfigStore.instance()
    cs.store(name="schema_toy_run", node=ToyRunConfig)
    cs.store(group="model", name="schema_toy", node=ToyModelConfig)


def validate(cfg: Any, *, world_size: int) -> None:
    require(cfg.model.get("arch") == "toy", f"model={cfg.model.get('name')} is not a toy preset; use model=toy_linear")
    check_known_keys(cfg, ToyRunConfig)
    check_known_keys(cfg.model, ToyModelConfig, prefix="model.")
    validate_run(cfg)
    d, t = cfg.data, cfg.train
    require(world_size == 1, f"the toy runs in one process, not {world_size}")
    require(cfg.eval_split in SPLITS, f"eval_split={cfg.eval_split!r} is unknown; use validation or test")
    require(d.classes > 1 and d.features > 0, "data.classes must be > 1 and data.features > 0")
    require(
        0 < 2 * d.held_out < d.points,
        f"data.held_out={d.held_out} x 2 must leave training points of data.points={d.points}",
    )
    require(t.lr > 0, f"train.lr={t.lr} must be positive")
    check_optimizer(cfg.optimizer, lr=t.lr)
    require(t.max_steps > 0 and 0 <= t.warmup_steps < t.max_steps, "train.warmup_steps must be in [0, train.max_steps)")


# ---- the task ----------------------------------------------------------------------------------
def blobs(d: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(points, labels) of train, validation and test: one seeded draw, split disjointly."""
    g = torch.Generator().manual_seed(d.seed)
    centres = d.separation * torch.randn(d.classes, d.features, generator=g)
    labels = torch.randperm(d.points, generator=g) % d.classes
    points = centres[labels] + torch.randn(d.points, d.features, generator=g)
    n = d.held_out
    ranges = {"validation": slice(0, n), "test": slice(n, 2 * n), "train": slice(2 * n, None)}
    return {split: (points[r], labels[r]) for split, r in ranges.items()}


def run(cfg: Any, *, run_dir: str | Path) -> dict:
    r = Run(cfg, run_dir, title=f"toy {cfg.optimizer.name} seed{cfg.seed}", tags=[cfg.optimizer.name])
    t, data = cfg.train, {k: (x.to(r.device), y.to(r.device)) for k, (x, y) in blobs(cfg.data).items()}
    model = torch.nn.Linear(cfg.data.features, cfg.data.classes, bias=cfg.model.bias).to(r.device)
    optimizer = build_optimizer(cfg.optimizer, model, lr=t.lr, prunable_names=["weight"])
    scheduler = build_lr_scheduler(optimizer, total_steps=t.max_steps, warmup_steps=t.warmup_steps, min_lr=t.min_lr)
    batches = torch.Generator().manual_seed(cfg.seed)
    state = r.restore(model=model, optimizer=optimizer, scheduler=scheduler, generators={"batches": batches},
                      lr=t.lr, may_change=("eval_split",))  # fmt: skip
    step, loss = (state["step"], state["train_loss"]) if state else (0, float("nan"))
    x, y = data["train"]
    while step < t.max_steps:
        rows = torch.randint(len(y), (t.batch_size,), generator=batches)
        batch_loss = F.cross_entropy(model(x[rows]), y[rows])
        batch_loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        scheduler.step_update(step)
        r.watch_loss(batch_loss.detach(), step=step)
        if step % t.checkpoint_interval == 0 or step == t.max_steps:
            loss = batch_loss.item()
            r.log.log({"train/loss": loss}, step=step)
            r.save(step=step, train_loss=loss)
    x, y = data[cfg.eval_split]
    with torch.no_grad():
        top1 = (model(x).argmax(1) == y).float().mean().item()
    train = {"steps": step, "final_train_loss": loss, "points": len(y)}
    return r.finish({"pipeline": "toy", "seed": cfg.seed, "eval_split": cfg.eval_split, "top1": top1, "train": train})


# ---- what the registry knows -------------------------------------------------------------------
def numbers(config: Mapping[str, Any], summary: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Accuracy (%) of the dense linear model on eval_split."""
    top1 = None if summary is None or summary.get("top1") is None else 100.0 * summary["top1"]
    return [{"metric": "top1", "method": "none", "pattern": "dense", "sparsity": 0.0, "value": top1}]


PIPELINE = Pipeline(
    name="toy",
    run=run,
    configs=Configs(register_configs, lr_key="train.lr"),
    checks=Checks(config=validate),  # the data are generated
    numbers=numbers,
    tuning=TuningScore("validation accuracy of the linear classifier", "maximize", lambda summary: summary["top1"]),
)
