"""The GPT-2 pipeline's config: schemas (types and required keys; the values are in
`configs/train_gpt2.yaml`, `configs/model/gpt2_*.yaml` and the presets) and the checks of
the values before any work."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

import pruning
from horst_sparse.training.config import (
    ConfigError,
    RunConfig,
    check_known_keys,
    pipeline_lr_key,
    require,
    run_schema,
    validate_run,
    validate_sparsities,
)
from horst_sparse.training.distributed import STRATEGIES
from horst_sparse.training.engine import check_engine
from horst_sparse.training.env import compile_problem, device_type
from horst_sparse.training.optim import check_optimizer
from horst_sparse.training.presets import register_help


@dataclasses.dataclass
class GPT2ModelConfig:
    arch: str = MISSING  # gpt2
    name: str = MISSING  # the preset's name, recorded in the summary
    n_layer: int = MISSING
    n_head: int = MISSING
    n_embd: int = MISSING
    n_positions: int = MISSING  # the context length of training and evaluation
    dropout: float = MISSING
    tie_word_embeddings: bool = MISSING


@dataclasses.dataclass
class LMDataConfig:
    name: str = MISSING  # pydoc: embedded, tokenized on first use; otherwise a prepared folder
    dir: str = MISSING
    vocabulary: str = (
        MISSING  # full: GPT-2's 50257 tokens | corpus: the compact vocabulary of the corpus (docs/design.md §5)
    )


@dataclasses.dataclass
class LMTrainConfig:
    lr: float = MISSING
    min_lr: float = MISSING
    warmup_lr: float = MISSING
    warmup_steps: int = MISSING
    max_steps: int = MISSING  # optimizer updates
    batch_size: int = MISSING  # sequences per update, over all processes
    micro_batch_size: int = MISSING  # sequences per forward pass and process (gradient accumulation)
    grad_clip: float = MISSING  # 0 disables clipping
    log_interval: int = MISSING
    eval_interval: int = MISSING  # updates between validation losses; 0 disables
    eval_windows: int = MISSING  # validation windows for the periodic loss (the final one uses all)
    checkpoint_interval: int = MISSING  # updates between checkpoints; 0: only at the end
    keep_checkpoints: int = MISSING
    peak_tflops: Optional[float] = MISSING  # for MFU on CUDA; null: looked up from the GPU name


@dataclasses.dataclass
class LMEvalConfig:
    batch_size: int = MISSING  # windows per forward pass
    max_windows: Optional[int] = MISSING  # null: all validation tokens


@dataclasses.dataclass
class OneShotPruneConfig:
    sparsities: List[float] = MISSING  # for the unstructured pattern; 0.0 evaluates the dense model
    scope: str = MISSING  # magnitude/unstructured: layerwise (the paper) | global
    preset: str = MISSING  # pruning.PRESETS key: the block matrices
    methods: List[str] = MISSING  # magnitude (the paper) | wanda
    patterns: List[str] = MISSING  # unstructured | "n:m" such as "2:4" (one row at sparsity 1 - n/m)
    calibration_windows: int = MISSING  # Wanda: random training windows of model.n_positions tokens
    calibration_seed: int = MISSING  # the generator of those windows
    at_steps: List[int] = MISSING  # updates at which every row is also measured during training (the curve); [] none


@dataclasses.dataclass
class ExportConfig:
    enabled: bool = MISSING  # write one pruned model as a transformers folder at the end of the run
    sparsity: float = MISSING  # for the unstructured pattern
    method: str = MISSING  # magnitude | wanda
    pattern: str = MISSING  # unstructured | "n:m"
    dir: Optional[str] = MISSING  # null: <run folder>/export


@dataclasses.dataclass
class GPT2RunConfig(RunConfig):
    eval_split: str = MISSING  # validation | test: the split of the final perplexities (periodic ones: validation)
    distributed: str = MISSING  # ddp | fsdp2 (horst_sparse.training.distributed.parallelize)
    data: LMDataConfig = MISSING
    train: LMTrainConfig = MISSING
    eval: LMEvalConfig = MISSING
    prune: OneShotPruneConfig = MISSING
    export: ExportConfig = MISSING
    engine: str = MISSING  # reference | fast (horst_sparse.training.engine)


def register_configs() -> None:
    """The schemas, and `--help`'s list of this pipeline's presets (the primary config names it)."""
    register_help("gpt2", "train GPT-2 with any optimizer, prune it one-shot, report perplexity after pruning")
    cs = ConfigStore.instance()
    cs.store(name="schema_gpt2_run", node=run_schema(GPT2RunConfig))  # its optimizer section open
    cs.store(group="model", name="schema_gpt2", node=GPT2ModelConfig)


def validate(cfg: DictConfig, *, world_size: int) -> None:
    """Raise `ConfigError` for the first value that cannot work."""
    require(
        cfg.model.get("arch") == "gpt2",
        f"model={cfg.model.get('name')} is not a GPT-2 preset; use model=gpt2_small, gpt2_tiny or gpt2_nano",
    )
    check_known_keys(cfg, GPT2RunConfig)
    check_known_keys(cfg.model, GPT2ModelConfig, prefix="model.")
    validate_run(cfg)
    check_engine(cfg)
    m, t = cfg.model, cfg.train
    require(cfg.distributed in STRATEGIES, f"distributed={cfg.distributed!r} is unknown; use {' or '.join(STRATEGIES)}")
    if cfg.distributed == "fsdp2":
        require(
            world_size > 1,
            "distributed=fsdp2 shards the model over processes and this run has one; launch it with "
            "torchrun --nproc_per_node=N (N >= 2), or use distributed=ddp",
        )
        require(
            not cfg.compile,
            "compile=true is not supported with distributed=fsdp2; use compile=false or distributed=ddp",
        )
    if cfg.compile:
        problem = compile_problem(device_type(cfg.device))
        require(problem is None, f"compile=true, but {problem}")
    for key in ("n_layer", "n_head", "n_embd", "n_positions"):
        require(m[key] > 0, f"model.{key}={m[key]} must be positive")
    require(m.n_embd % m.n_head == 0, f"model.n_embd={m.n_embd} must be divisible by model.n_head={m.n_head}")
    require(0 <= m.dropout < 1, f"model.dropout={m.dropout} must be in [0, 1)")
    require(
        cfg.eval_split in ("validation", "test"),
        f"eval_split={cfg.eval_split!r} is unknown; use validation (tuning, monitoring) or test (the reported numbers)",
    )
    require(
        cfg.data.vocabulary in ("full", "corpus"),
        f"data.vocabulary={cfg.data.vocabulary!r} is unknown; use full (GPT-2's 50257 tokens) or corpus",
    )
    require(t.lr > 0, f"train.lr={t.lr} must be positive")
    check_optimizer(cfg.optimizer, lr=t.lr, lr_key=pipeline_lr_key(cfg))
    require(0 <= t.min_lr <= t.lr, f"train.min_lr={t.min_lr} must be in [0, train.lr={t.lr}]")
    require(t.warmup_lr >= 0, f"train.warmup_lr={t.warmup_lr} must be >= 0")
    require(t.max_steps > 0, f"train.max_steps={t.max_steps} must be positive")
    require(0 <= t.warmup_steps < t.max_steps, f"train.warmup_steps={t.warmup_steps} must be in [0, train.max_steps)")
    require(t.micro_batch_size > 0, f"train.micro_batch_size={t.micro_batch_size} must be positive")
    require(
        t.batch_size > 0 and t.batch_size % (t.micro_batch_size * world_size) == 0,
        f"train.batch_size={t.batch_size} must be a positive multiple of train.micro_batch_size="
        f"{t.micro_batch_size} x {world_size} processes",
    )
    require(t.grad_clip >= 0, f"train.grad_clip={t.grad_clip} must be >= 0 (0 disables clipping)")
    for key in ("log_interval", "eval_interval", "eval_windows", "checkpoint_interval"):
        require(t[key] >= 0, f"train.{key}={t[key]} must be >= 0")
    require(t.keep_checkpoints >= 1, f"train.keep_checkpoints={t.keep_checkpoints} must be >= 1")
    require(cfg.eval.batch_size > 0, f"eval.batch_size={cfg.eval.batch_size} must be positive")
    require(
        len(cfg.prune.sparsities) > 0, "prune.sparsities is empty; list at least one (0.0 evaluates the dense model)"
    )
    validate_sparsities(cfg.prune.sparsities, key="prune.sparsities")
    at = list(cfg.prune.at_steps)
    require(
        all(0 < s < t.max_steps for s in at) and at == sorted(set(at)),
        f"prune.at_steps={at} must be increasing updates in [1, train.max_steps={t.max_steps}) "
        "(the final model is measured anyway)",
    )
    require(
        not at or 0.0 in cfg.prune.sparsities,
        "prune.at_steps pairs each pruned perplexity with the dense model's: list 0.0 in prune.sparsities",
    )
    require(
        cfg.prune.scope in ("layerwise", "global"),
        f"prune.scope={cfg.prune.scope!r} is unknown; use layerwise or global",
    )
    validate_pruning(cfg.prune, cfg.export, n_embd=m.n_embd)


def validate_pruning(p: DictConfig, e: DictConfig, *, n_embd: int) -> None:
    """The one-shot pruning methods and patterns (`prune`) and the export switch (`export`)."""
    for key, values in (("prune.methods", p.methods), ("prune.patterns", p.patterns)):
        require(len(values) > 0, f"{key} is empty; list at least one")
    for key, method in [*(("prune.methods", v) for v in p.methods), ("export.method", e.method)]:
        require(method in pruning.METHODS, f"{key} has {method!r}: choose from {', '.join(pruning.METHODS)}")
    for key, pattern in [*(("prune.patterns", v) for v in p.patterns), ("export.pattern", e.pattern)]:
        try:
            nm = pruning.parse_pattern(pattern)
        except ValueError as error:
            raise ConfigError(f"{key}: {error}") from None
        require(
            nm is None or n_embd % nm[1] == 0,
            f"{key} has {pattern!r}: groups of {nm and nm[1]} must tile model.n_embd={n_embd} (every matrix's inputs)",
        )
    if "wanda" in p.methods or e.method == "wanda":
        require(
            p.calibration_windows > 0, f"prune.calibration_windows={p.calibration_windows} must be positive for wanda"
        )
    require(0 <= e.sparsity < 1, f"export.sparsity={e.sparsity} must be in [0, 1)")
