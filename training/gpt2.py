"""GPT-2 pipeline pieces: the config schema, model construction, validation, FLOPs per token.

Used by `train_gpt2.py`; the model is Hugging Face's `GPT2LMHeadModel` built from a preset
in `configs/model/gpt2_*.yaml` (DESIGN §4: GPT-2 Small is 12 layers, 768 wide, 12 heads,
context 1024, no dropout, tied embeddings).
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from training.config import LoggingConfig, register_shared_configs, require, validate_logging, validate_optimizer, validate_sparsities

PREPARE_SLIMPAJAMA = "python scripts/prepare_slimpajama.py --out {dir}"


@dataclasses.dataclass
class GPT2ModelConfig:
    arch: str = "gpt2"
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_positions: int = 1024  # the context length of training and evaluation
    dropout: float = 0.0
    tie_word_embeddings: bool = True


@dataclasses.dataclass
class LMDataConfig:
    name: str = "pydoc"  # pydoc: embedded, tokenized on first use; otherwise a prepared folder
    dir: str = "data/pydoc"


@dataclasses.dataclass
class LMTrainConfig:
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_lr: float = 0.0
    warmup_steps: int = 10
    max_steps: int = 100  # optimizer updates
    batch_size: int = 16  # sequences per update, over all processes
    micro_batch_size: int = 16  # sequences per forward pass and process (gradient accumulation)
    grad_clip: float = 1.0  # 0 disables clipping
    log_interval: int = 10
    eval_interval: int = 50  # updates between validation losses; 0 disables
    eval_windows: int = 32  # validation windows for the periodic loss (the final one uses all)
    checkpoint_interval: int = 100  # updates between checkpoints; 0: only at the end
    keep_checkpoints: int = 2
    peak_tflops: Optional[float] = None  # for MFU on CUDA; None: looked up from the GPU name


@dataclasses.dataclass
class LMEvalConfig:
    batch_size: int = 16  # windows per forward pass
    max_windows: Optional[int] = None  # None: all validation tokens


@dataclasses.dataclass
class OneShotPruneConfig:
    sparsities: List[float] = dataclasses.field(default_factory=lambda: [0.0, 0.5, 0.6, 0.7, 0.8, 0.9])
    scope: str = "layerwise"  # layerwise (the paper) | global
    preset: str = "gpt2"  # pruning.PRESETS key: the block matrices


@dataclasses.dataclass
class GPT2RunConfig:
    model: Any = MISSING  # configs/model/gpt2_*.yaml (schema GPT2ModelConfig)
    optimizer: Any = MISSING  # configs/optimizer/*.yaml (schemas in training.config)
    data: LMDataConfig = dataclasses.field(default_factory=LMDataConfig)
    train: LMTrainConfig = dataclasses.field(default_factory=LMTrainConfig)
    eval: LMEvalConfig = dataclasses.field(default_factory=LMEvalConfig)
    prune: OneShotPruneConfig = dataclasses.field(default_factory=OneShotPruneConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | bf16 | fp32
    deterministic: bool = False
    compile: bool = False  # torch.compile the model for training
    resume: Optional[str] = "auto"  # auto: latest checkpoint in the run folder | never | a path


def register_configs() -> None:
    register_shared_configs()
    cs = ConfigStore.instance()
    cs.store(name="schema_gpt2_run", node=GPT2RunConfig)
    cs.store(group="model", name="schema_gpt2", node=GPT2ModelConfig)


def validate(cfg: DictConfig, *, model_choice: str | None, world_size: int) -> None:
    """Raise `ConfigError` for the first value that cannot work."""
    require(
        cfg.model.get("arch") == "gpt2",
        f"model={model_choice or cfg.model.get('arch')} is not a GPT-2 preset; use model=gpt2_small, gpt2_tiny or gpt2_nano",
    )
    m, t = cfg.model, cfg.train
    for key in ("n_layer", "n_head", "n_embd", "n_positions"):
        require(m[key] > 0, f"model.{key}={m[key]} must be positive")
    require(m.n_embd % m.n_head == 0, f"model.n_embd={m.n_embd} must be divisible by model.n_head={m.n_head}")
    require(0 <= m.dropout < 1, f"model.dropout={m.dropout} must be in [0, 1)")
    validate_optimizer(cfg.optimizer, lr=t.lr)
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
    require(len(cfg.prune.sparsities) > 0, "prune.sparsities is empty; list at least one (0.0 evaluates the dense model)")
    validate_sparsities(cfg.prune.sparsities, key="prune.sparsities")
    require(cfg.prune.scope in ("layerwise", "global"), f"prune.scope={cfg.prune.scope!r} is unknown; use layerwise or global")
    require(cfg.device in ("auto", "cpu", "cuda"), f"device={cfg.device!r} is unknown; use auto, cpu or cuda")
    require(cfg.precision in ("auto", "bf16", "fp32"), f"precision={cfg.precision!r} is unknown; use auto, bf16 or fp32")
    validate_logging(cfg.logging)


def build_model(model_cfg: DictConfig):
    """A randomly initialised `GPT2LMHeadModel` with SDPA attention and GPT-2's vocabulary."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=50257,
        n_positions=model_cfg.n_positions,
        n_embd=model_cfg.n_embd,
        n_layer=model_cfg.n_layer,
        n_head=model_cfg.n_head,
        resid_pdrop=model_cfg.dropout,
        embd_pdrop=model_cfg.dropout,
        attn_pdrop=model_cfg.dropout,
        tie_word_embeddings=model_cfg.tie_word_embeddings,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return GPT2LMHeadModel(config)


def flops_per_token(model, context: int) -> float:
    """Training FLOPs per token (forward + backward): 6 N plus attention, N without the
    position embedding (PaLM appendix B; the token embedding counts as the tied output layer)."""
    c = model.config
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    return 6 * n + 12 * c.n_layer * c.n_embd * context
