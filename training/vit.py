"""ViT pipeline pieces: the config schema and its validation, the timm model, the AC/DC
schedule from the config, top-1/top-5 evaluation.

Used by `train_vit.py`. Models are timm VisionTransformers (DeiT-tiny/small/base, DESIGN §4,
and small presets for the CPU) from `configs/model/{deit,vit}_*.yaml`; the recipe values
(data, augmentation, schedule, AC/DC phases) come from `configs/vit_recipe/*.yaml`, which
is why the schema below leaves them without defaults.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional

import torch
import torch.nn.functional as F
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

import pruning
from training.config import ConfigError, LoggingConfig, register_shared_configs, require, validate_logging, validate_optimizer
from training.distributed import all_reduce_sum
from training.env import autocast


@dataclasses.dataclass
class ViTModelConfig:
    arch: str = "vit"
    timm_name: str = MISSING  # a timm VisionTransformer, e.g. deit_small_patch16_224
    img_size: int = MISSING
    patch_size: int = MISSING
    embed_dim: int = MISSING
    depth: int = MISSING
    num_heads: int = MISSING
    drop_path: float = MISSING  # stochastic depth rate


@dataclasses.dataclass
class ImageDataConfig:
    name: str = MISSING  # digits (embedded) | imagefolder (ImageNet layout under root)
    root: Optional[str] = None  # imagefolder: a folder with train/<class>/ and val/<class>/
    val_fraction: float = 0.2  # digits: stratified validation split
    num_workers: int = MISSING  # DataLoader workers per process
    pin_memory: bool = True  # on CUDA
    repeated_aug: int = MISSING  # repeats per image and epoch under DDP (RepeatAugSampler); 1: off


@dataclasses.dataclass
class AugConfig:
    auto_augment: Optional[str] = MISSING  # timm policy, e.g. rand-m9-mstd0.5-inc1; null: off
    color_jitter: float = MISSING  # used by timm only without auto_augment
    hflip: float = MISSING
    scale: List[float] = MISSING  # random resized crop area range
    interpolation: str = MISSING
    re_prob: float = MISSING  # random erasing
    re_mode: str = MISSING
    re_count: int = MISSING
    crop_pct: float = MISSING  # eval: resize to img_size / crop_pct, centre crop img_size
    mixup: float = MISSING  # Beta(alpha) of mixup; 0: off
    cutmix: float = MISSING  # Beta(alpha) of cutmix; 0: off
    mixup_prob: float = MISSING
    mixup_switch_prob: float = MISSING
    smoothing: float = MISSING  # label smoothing


@dataclasses.dataclass
class ViTTrainConfig:
    epochs: int = MISSING
    batch_size: int = MISSING  # images per update, over all processes
    base_lr: float = MISSING  # lr = base_lr * batch_size / base_batch_size (linear scaling)
    base_batch_size: int = MISSING
    min_lr: float = MISSING
    warmup_lr: float = MISSING
    warmup_epochs: int = MISSING  # linear warm-up, then cosine; both stepped per update
    grad_clip: float = 0.0  # 0: no clipping (DeiT)
    eval_batch_size: int = MISSING  # per process
    log_interval: int = MISSING  # updates between training-loss records
    checkpoint_interval: int = 1  # epochs between checkpoints (the last epoch always)
    keep_checkpoints: int = 2


@dataclasses.dataclass
class ACDCConfig:
    sparsity: float = MISSING  # target sparsity of the compressed phases over the prunable set
    scope: str = "global"  # global (AC/DC) | layerwise
    preset: str = "vit"  # pruning.PRESETS key: qkv, proj, fc1, fc2 of every block
    patterns: List[str] = dataclasses.field(default_factory=list)  # extra module-name regexes
    # Phase lengths in epochs; must add up to train.epochs (DESIGN §3.3).
    dense_warmup: int = MISSING
    compressed: int = MISSING
    decompressed: int = MISSING
    final_decompressed: int = MISSING
    final_compressed: int = MISSING
    reset_second_moment: bool = False  # at each restore; AC/DC resets the first moment only
    histogram_bins: int = 100  # log10|w| histogram of the prunable weights, every epoch


@dataclasses.dataclass
class ViTRunConfig:
    model: Any = MISSING  # configs/model/{deit,vit}_*.yaml (schema ViTModelConfig)
    optimizer: Any = MISSING  # configs/optimizer/*.yaml (schemas in training.config)
    data: ImageDataConfig = dataclasses.field(default_factory=ImageDataConfig)
    aug: AugConfig = dataclasses.field(default_factory=AugConfig)
    train: ViTTrainConfig = dataclasses.field(default_factory=ViTTrainConfig)
    acdc: ACDCConfig = dataclasses.field(default_factory=ACDCConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | bf16 | fp32
    deterministic: bool = False
    compile: bool = False  # torch.compile the model
    cpu_threads: Optional[int] = None  # torch intra-op threads; None: torch's default
    resume: Optional[str] = "auto"  # auto: latest checkpoint in the run folder | never | a path


def register_configs() -> None:
    register_shared_configs()
    cs = ConfigStore.instance()
    cs.store(name="schema_vit_run", node=ViTRunConfig)
    cs.store(group="model", name="schema_vit", node=ViTModelConfig)


def scaled_lr(train: DictConfig) -> float:
    """DeiT's linear scaling rule: base_lr per base_batch_size images."""
    return train.base_lr * train.batch_size / train.base_batch_size


def acdc_schedule(acdc: DictConfig, *, epochs: int) -> pruning.ACDCSchedule:
    try:
        return pruning.ACDCSchedule(
            epochs,
            dense_warmup=acdc.dense_warmup,
            compressed=acdc.compressed,
            decompressed=acdc.decompressed,
            final_decompressed=acdc.final_decompressed,
            final_compressed=acdc.final_compressed,
        )
    except ValueError as error:
        raise ConfigError(f"acdc phases do not fit train.epochs={epochs}: {error}") from None


def validate(cfg: DictConfig, *, model_choice: str | None, world_size: int) -> None:
    """Raise `ConfigError` for the first value that cannot work."""
    import timm

    m, t, d, a = cfg.model, cfg.train, cfg.data, cfg.aug
    require(
        m.get("arch") == "vit",
        f"model={model_choice or m.get('arch')} is not a ViT preset; use model=deit_tiny, deit_small, deit_base, "
        "vit_digits or vit_nano",
    )
    require(timm.is_model(m.timm_name), f"model.timm_name={m.timm_name!r} is not a timm model")
    for key in ("img_size", "patch_size", "embed_dim", "depth", "num_heads"):
        require(m[key] > 0, f"model.{key}={m[key]} must be positive")
    require(m.img_size % m.patch_size == 0, f"model.img_size={m.img_size} must be a multiple of model.patch_size={m.patch_size}")
    require(m.embed_dim % m.num_heads == 0, f"model.embed_dim={m.embed_dim} must be divisible by model.num_heads={m.num_heads}")
    require(0 <= m.drop_path < 1, f"model.drop_path={m.drop_path} must be in [0, 1)")

    require(t.base_batch_size > 0, f"train.base_batch_size={t.base_batch_size} must be positive")
    require(t.batch_size > 0, f"train.batch_size={t.batch_size} must be positive")
    validate_optimizer(cfg.optimizer, lr=t.base_lr, lr_key="train.base_lr")
    lr = scaled_lr(t)
    require(t.epochs > 0, f"train.epochs={t.epochs} must be positive")
    require(
        t.batch_size % world_size == 0,
        f"train.batch_size={t.batch_size} must be a multiple of the {world_size} processes",
    )
    mixing = a.mixup > 0 or a.cutmix > 0
    require(
        not mixing or (t.batch_size // world_size) % 2 == 0,
        f"train.batch_size={t.batch_size} over {world_size} processes must give an even batch per process "
        "(timm's Mixup pairs images)",
    )
    require(0 <= t.min_lr <= lr, f"train.min_lr={t.min_lr} must be in [0, lr={lr:g}] (lr = base_lr x batch_size / base_batch_size)")
    require(t.warmup_lr >= 0, f"train.warmup_lr={t.warmup_lr} must be >= 0")
    require(0 <= t.warmup_epochs < t.epochs, f"train.warmup_epochs={t.warmup_epochs} must be in [0, train.epochs)")
    require(t.grad_clip >= 0, f"train.grad_clip={t.grad_clip} must be >= 0 (0 disables clipping)")
    require(t.eval_batch_size > 0, f"train.eval_batch_size={t.eval_batch_size} must be positive")
    for key in ("log_interval", "checkpoint_interval"):
        require(t[key] >= 0, f"train.{key}={t[key]} must be >= 0")
    require(t.keep_checkpoints >= 1, f"train.keep_checkpoints={t.keep_checkpoints} must be >= 1")

    require(d.name in ("digits", "imagefolder"), f"data.name={d.name!r} is unknown; use digits or imagefolder")
    require(0 < d.val_fraction < 1, f"data.val_fraction={d.val_fraction} must be in (0, 1)")
    require(d.num_workers >= 0, f"data.num_workers={d.num_workers} must be >= 0")
    require(d.repeated_aug >= 1, f"data.repeated_aug={d.repeated_aug} must be >= 1 (1: no repeated augmentation)")

    scale = list(a.scale)
    require(len(scale) == 2 and 0 < scale[0] <= scale[1] <= 1, f"aug.scale={scale} must be [low, high] with 0 < low <= high <= 1")
    for key in ("hflip", "re_prob", "mixup_prob", "mixup_switch_prob"):
        require(0 <= a[key] <= 1, f"aug.{key}={a[key]} must be in [0, 1]")
    for key in ("mixup", "cutmix", "color_jitter"):
        require(a[key] >= 0, f"aug.{key}={a[key]} must be >= 0 (0: off)")
    require(0 <= a.smoothing < 1, f"aug.smoothing={a.smoothing} must be in [0, 1)")
    require(0 < a.crop_pct <= 1, f"aug.crop_pct={a.crop_pct} must be in (0, 1]")
    require(a.re_count >= 1, f"aug.re_count={a.re_count} must be >= 1")
    require(a.re_mode in ("const", "rand", "pixel"), f"aug.re_mode={a.re_mode!r} is unknown; use const, rand or pixel")
    require(
        a.interpolation in ("bilinear", "bicubic", "nearest", "random"),
        f"aug.interpolation={a.interpolation!r} is unknown; use bilinear, bicubic, nearest or random",
    )
    if a.auto_augment:
        from training.vit_data import build_transforms

        try:
            build_transforms(a, img_size=m.img_size)
        except (AssertionError, ValueError, KeyError, IndexError):  # what timm's policy parser raises
            raise ConfigError(
                f"aug.auto_augment={a.auto_augment!r} is not a timm augmentation policy such as "
                "rand-m9-mstd0.5-inc1 (null: off)"
            ) from None

    c = cfg.acdc
    require(0 <= c.sparsity < 1, f"acdc.sparsity={c.sparsity} must be in [0, 1)")
    require(c.scope in pruning.SCOPES, f"acdc.scope={c.scope!r} is unknown; use {' or '.join(pruning.SCOPES)}")
    require(c.preset in pruning.PRESETS, f"acdc.preset={c.preset!r} is unknown; use one of {', '.join(pruning.PRESETS)}")
    require(c.histogram_bins >= 1, f"acdc.histogram_bins={c.histogram_bins} must be >= 1")
    acdc_schedule(c, epochs=t.epochs)

    require(cfg.cpu_threads is None or cfg.cpu_threads > 0, f"cpu_threads={cfg.cpu_threads} must be positive or null")
    require(cfg.device in ("auto", "cpu", "cuda"), f"device={cfg.device!r} is unknown; use auto, cpu or cuda")
    require(cfg.precision in ("auto", "bf16", "fp32"), f"precision={cfg.precision!r} is unknown; use auto, bf16 or fp32")
    validate_logging(cfg.logging)


def build_model(model_cfg: DictConfig, *, num_classes: int) -> torch.nn.Module:
    """A randomly initialised timm VisionTransformer with the preset's shape."""
    import timm

    return timm.create_model(
        model_cfg.timm_name,
        pretrained=False,
        num_classes=num_classes,
        img_size=model_cfg.img_size,
        patch_size=model_cfg.patch_size,
        embed_dim=model_cfg.embed_dim,
        depth=model_cfg.depth,
        num_heads=model_cfg.num_heads,
        drop_path_rate=model_cfg.drop_path,
    )


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    loader,
    *,
    device: torch.device,
    dtype: torch.dtype,
    channels_last: bool = False,
) -> dict[str, float]:
    """`{"top1", "top5", "loss", "images"}` over every validation image (all processes
    together); top-5 is top-min(5, classes). Accuracies are fractions in [0, 1]."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, top-1, top-5 hits, images
    for images, targets in loader:
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with autocast(device, dtype):
            logits = model(images)
        logits = logits.float()
        hits = logits.topk(min(5, logits.shape[1]), dim=1).indices == targets[:, None]
        totals += torch.stack(
            [
                F.cross_entropy(logits, targets, reduction="sum").double(),
                hits[:, 0].sum().double(),
                hits.any(dim=1).sum().double(),
                torch.tensor(len(targets), dtype=torch.float64, device=device),
            ]
        )
    all_reduce_sum(totals)
    model.train(was_training)
    loss_sum, top1, top5, count = totals.tolist()
    return {"top1": top1 / count, "top5": top5 / count, "loss": loss_sum / count, "images": int(count)}
