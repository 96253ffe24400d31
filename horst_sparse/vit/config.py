"""The ViT pipeline's config: schemas (types and required keys; the values are in
`configs/train_vit.yaml`, `configs/model/{deit,vit}_*.yaml` and the recipes in
`configs/vit_recipe/`), the checks of the values before any work, and the two values derived
from them (the scaled lr, the AC/DC schedule)."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, List, Optional

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

import pruning
from horst_sparse.training.config import (
    ConfigError,
    RunConfig,
    check_known_keys,
    pipeline_lr_key,
    require,
    run_schema,
    validate_run,
)
from horst_sparse.training.engine import check_engine
from horst_sparse.training.optim import check_optimizer
from horst_sparse.training.presets import presets, register_help
from horst_sparse.vit.model import pair


@dataclasses.dataclass
class ViTModelConfig:
    arch: str = MISSING  # vit
    name: str = MISSING  # the preset's name, recorded in the summary
    timm_name: str = MISSING  # a timm VisionTransformer, e.g. deit_small_patch16_224
    img_size: Any = MISSING  # n (square) or [height, width], e.g. MNIST-1D's [1, 40]
    patch_size: Any = MISSING  # n or [height, width], e.g. [1, 4]
    embed_dim: int = MISSING
    depth: int = MISSING
    num_heads: int = MISSING
    drop_path: float = MISSING  # stochastic depth rate
    # the most images of this model one process takes in one pass (a GPU's memory); None: no limit known
    max_images_per_pass: Optional[int] = None


@dataclasses.dataclass
class ImageDataConfig:
    name: str = MISSING  # digits | mnist1d (embedded) | imagefolder (ImageNet layout under root)
    root: Optional[str] = MISSING  # imagefolder: a folder with train/<class>/ and val/<class>/
    val_fraction: Optional[float] = MISSING  # digits, mnist1d: stratified validation split; null otherwise
    test_fraction: Optional[float] = MISSING  # digits, mnist1d: stratified test split; null: none
    num_samples: Optional[int] = MISSING  # mnist1d: examples generated (all splits); null otherwise
    minival_size: Optional[int] = MISSING  # imagefolder: training images held out as validation; val/ is the test split
    num_workers: int = MISSING  # DataLoader workers per process
    pin_memory: bool = MISSING  # on CUDA
    repeated_aug: int = MISSING  # repeats per image and epoch under DDP (RepeatAugSampler); 1: off
    skip_corrupt: bool = MISSING  # imagefolder: replace unreadable images by the next one and count them


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
    accum_steps: int = MISSING  # forward/backward passes per update (gradient accumulation): batch_size / (processes x accum_steps) images each
    base_lr: float = MISSING  # lr = base_lr * batch_size / base_batch_size (linear scaling)
    base_batch_size: int = MISSING
    min_lr: float = MISSING
    warmup_lr: float = MISSING
    warmup_epochs: int = MISSING  # linear warm-up, then cosine; both stepped per update
    grad_clip: float = MISSING  # 0: no clipping (DeiT)
    eval_batch_size: int = MISSING  # per process
    log_interval: int = MISSING  # updates between training-loss records
    checkpoint_interval: int = MISSING  # epochs between checkpoints (the last epoch always)
    keep_checkpoints: int = MISSING


@dataclasses.dataclass
class ACDCConfig:
    sparsity: float = MISSING  # target sparsity of the compressed phases over the prunable set
    scope: str = MISSING  # global (AC/DC) | layerwise
    pattern: str = MISSING  # unstructured | "n:m" (e.g. "2:4", along each matrix's inputs; sparsity 1 - n/m)
    preset: str = MISSING  # pruning.PRESETS key: qkv, proj, fc1, fc2 of every block
    patterns: List[str] = MISSING  # extra module-name regexes
    # Phase lengths in epochs; must add up to train.epochs (docs/design.md §3.3).
    dense_warmup: int = MISSING
    compressed: int = MISSING
    decompressed: int = MISSING
    final_decompressed: int = MISSING
    final_compressed: int = MISSING
    reset_second_moment: bool = MISSING  # at each restore; AC/DC resets the first moment only
    histogram_bins: int = MISSING  # log10|w| histogram of the prunable weights, every epoch


@dataclasses.dataclass
class ViTRunConfig(RunConfig):
    eval_split: str = MISSING  # validation | test: the split of the final top-1/top-5 (every epoch's is validation)
    data: ImageDataConfig = MISSING
    aug: AugConfig = MISSING
    train: ViTTrainConfig = MISSING
    acdc: ACDCConfig = MISSING
    engine: str = MISSING  # reference | fast (horst_sparse.training.engine)


EVAL_SPLITS = ("validation", "test")
DATASETS = ("digits", "imagefolder", "mnist1d")


def register_configs() -> None:
    """The schemas, and `--help`'s list of this pipeline's presets (the primary config names it)."""
    register_help("vit", "train a ViT/DeiT under AC/DC with any optimizer, report the final sparse model's accuracy")
    cs = ConfigStore.instance()
    cs.store(name="schema_vit_run", node=run_schema(ViTRunConfig))  # its optimizer section open
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


def prunable_set(model: Any, acdc: DictConfig) -> dict:
    """`{name: weight}` of the matrices AC/DC prunes: the preset's and those `acdc.patterns`
    add. A pattern that selects no weight of `model` is a `ConfigError` (a typo would
    otherwise leave the prunable set as it was, silently)."""
    for pattern in acdc.patterns:
        try:
            pruning.prunable_parameters(model, patterns=[pattern])
        except ValueError:
            names = [
                name
                for name, module in model.named_modules()
                if isinstance(module, torch.nn.Linear) and not any(re.search(x, name) for x in pruning.DEFAULT_EXCLUDE)
            ]
            raise ConfigError(
                f"acdc.patterns has {pattern!r}, which matches no prunable layer of the model (regexes on module "
                f"names: {', '.join(names[:3])}, ..., {names[-1]}; the head and patch embedding are never pruned)"
            ) from None
    return pruning.prunable_parameters(model, acdc.preset, patterns=list(acdc.patterns) or None)


def check_prunable_set(cfg: DictConfig) -> None:
    """`prunable_set` on the model `cfg` builds, on the meta device (no memory): the check
    a run makes once its model exists, made before any run. The preset alone always selects
    a ViT's block matrices; only `acdc.patterns` need the model."""
    if cfg.acdc.patterns:
        _check_patterns(OmegaConf.to_yaml(cfg.model), tuple(cfg.acdc.patterns))


@functools.cache
def _check_patterns(model_yaml: str, patterns: tuple[str, ...]) -> None:
    from horst_sparse.vit.model import build_model

    with torch.device("meta"):
        model = build_model(OmegaConf.create(model_yaml), num_classes=10)
    prunable_set(model, OmegaConf.create({"preset": "vit", "patterns": list(patterns)}))


def validate(cfg: DictConfig, *, world_size: int) -> None:
    """Raise `ConfigError` for the first value that cannot work."""
    import timm

    m, t, d, a = cfg.model, cfg.train, cfg.data, cfg.aug
    if m.get("arch") != "vit":  # the list is read from configs/model/ only on this failing path
        models = " | ".join(presets("vit")["model"])
        raise ConfigError(f"model={m.get('name')} is not a ViT preset; use model={models}")
    check_known_keys(cfg, ViTRunConfig)
    check_known_keys(m, ViTModelConfig, prefix="model.")
    require(timm.is_model(m.timm_name), f"model.timm_name={m.timm_name!r} is not a timm model")
    for key in ("img_size", "patch_size"):
        size = m[key]
        require(
            isinstance(size, int) or (len(size) == 2 and all(isinstance(n, int) for n in size)),
            f"model.{key}={size} must be an integer or [height, width]",
        )
        require(min(pair(size)) > 0, f"model.{key}={size} must be positive")
    for key in ("embed_dim", "depth", "num_heads"):
        require(m[key] > 0, f"model.{key}={m[key]} must be positive")
    require(
        all(n % p == 0 for n, p in zip(pair(m.img_size), pair(m.patch_size))),
        f"model.img_size={m.img_size} must be a multiple of model.patch_size={m.patch_size}",
    )
    require(
        m.embed_dim % m.num_heads == 0,
        f"model.embed_dim={m.embed_dim} must be divisible by model.num_heads={m.num_heads}",
    )
    require(0 <= m.drop_path < 1, f"model.drop_path={m.drop_path} must be in [0, 1)")

    require(t.base_batch_size > 0, f"train.base_batch_size={t.base_batch_size} must be positive")
    require(t.batch_size > 0, f"train.batch_size={t.batch_size} must be positive")
    require(t.base_lr > 0, f"train.base_lr={t.base_lr} must be positive")
    lr = scaled_lr(t)
    check_optimizer(cfg.optimizer, lr=lr, lr_key=pipeline_lr_key(cfg))
    require(t.epochs > 0, f"train.epochs={t.epochs} must be positive")
    require(t.accum_steps >= 1, f"train.accum_steps={t.accum_steps} must be >= 1 (1: no gradient accumulation)")
    require(
        t.batch_size % (world_size * t.accum_steps) == 0,
        f"train.batch_size={t.batch_size} must be a multiple of the {world_size} processes x train.accum_steps="
        f"{t.accum_steps}",
    )
    per_pass = t.batch_size // (world_size * t.accum_steps)
    if m.max_images_per_pass is not None and per_pass > m.max_images_per_pass:
        # the smallest accumulation that fits and divides the batch (one GPU under slurm_1gpu: DeiT-B's 1024 in 2 passes)
        fits = next(n for n in range(t.accum_steps, t.batch_size + 1) if t.batch_size % (world_size * n) == 0
                    and t.batch_size // (world_size * n) <= m.max_images_per_pass)  # fmt: skip
        raise ConfigError(
            f"train.batch_size={t.batch_size} over {world_size} process(es) x train.accum_steps={t.accum_steps} puts "
            f"{per_pass} images of {m.name} in one pass, over model.max_images_per_pass={m.max_images_per_pass} (the "
            f"memory of one GPU): pass train.accum_steps={fits}, or run more processes"
        )
    mixing = a.mixup > 0 or a.cutmix > 0
    require(
        not mixing or (t.batch_size // world_size) % 2 == 0,
        f"train.batch_size={t.batch_size} over {world_size} processes must give an even batch per process "
        "(timm's Mixup pairs images)",
    )
    require(
        0 <= t.min_lr <= lr,
        f"train.min_lr={t.min_lr} must be in [0, lr={lr:g}] (lr = base_lr x batch_size / base_batch_size)",
    )
    require(t.warmup_lr >= 0, f"train.warmup_lr={t.warmup_lr} must be >= 0")
    require(0 <= t.warmup_epochs < t.epochs, f"train.warmup_epochs={t.warmup_epochs} must be in [0, train.epochs)")
    require(t.grad_clip >= 0, f"train.grad_clip={t.grad_clip} must be >= 0 (0 disables clipping)")
    require(t.eval_batch_size > 0, f"train.eval_batch_size={t.eval_batch_size} must be positive")
    for key in ("log_interval", "checkpoint_interval"):
        require(t[key] >= 0, f"train.{key}={t[key]} must be >= 0")
    require(t.keep_checkpoints >= 1, f"train.keep_checkpoints={t.keep_checkpoints} must be >= 1")

    require(
        cfg.eval_split in EVAL_SPLITS,
        f"eval_split={cfg.eval_split!r} is unknown; use validation (tuning, monitoring) or test (the reported numbers)",
    )
    require(
        d.name in DATASETS, f"data.name={d.name!r} is unknown; use digits or imagefolder (ImageNet layout) or mnist1d"
    )
    if d.name in ("digits", "mnist1d"):
        require(
            d.val_fraction is not None and 0 < d.val_fraction < 1,
            f"data.val_fraction={d.val_fraction} must be in (0, 1)",
        )
        require(
            d.test_fraction is None or 0 <= d.test_fraction < 1 - d.val_fraction,
            f"data.test_fraction={d.test_fraction} must be in [0, 1 - data.val_fraction) or null (no test split)",
        )
    if d.name == "mnist1d":
        require(d.num_samples is not None and d.num_samples >= 100, f"data.num_samples={d.num_samples} must be >= 100")
        require(
            pair(m.img_size) == (1, 40), f"model.img_size={m.img_size} must be [1, 40] for MNIST-1D (model=vit_mnist1d)"
        )
    if d.name == "imagefolder":
        require(
            d.minival_size is not None and d.minival_size > 0,
            f"data.minival_size={d.minival_size} must be positive: the training images held out for validation (ImageNet: 10000)",
        )
    require(d.num_workers >= 0, f"data.num_workers={d.num_workers} must be >= 0")
    require(d.repeated_aug >= 1, f"data.repeated_aug={d.repeated_aug} must be >= 1 (1: no repeated augmentation)")

    scale = list(a.scale)
    require(
        len(scale) == 2 and 0 < scale[0] <= scale[1] <= 1,
        f"aug.scale={scale} must be [low, high] with 0 < low <= high <= 1",
    )
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
        from horst_sparse.vit.data import build_transforms

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
    if c.pattern != "unstructured":
        n, _, m = str(c.pattern).partition(":")
        require(
            n.isdigit() and m.isdigit() and 0 < int(n) < int(m),
            f'acdc.pattern={c.pattern!r} is unknown; use unstructured or n:m such as "2:4"',
        )
        require(
            abs(c.sparsity - (1 - int(n) / int(m))) < 1e-9,
            f"acdc.pattern={c.pattern} prunes {1 - int(n) / int(m):g} of the weights; set acdc.sparsity={1 - int(n) / int(m):g}",
        )
    require(
        c.preset in pruning.PRESETS, f"acdc.preset={c.preset!r} is unknown; use one of {', '.join(pruning.PRESETS)}"
    )
    for pattern in c.patterns:
        n, colon, m = str(pattern).partition(":")
        if colon and n.isdigit() and m.isdigit():  # an N:M pattern given where module names belong
            raise ConfigError(
                f"acdc.patterns has {pattern!r}, but acdc.patterns are module-name regexes added to the prunable set; "
                f'for {pattern} masks use acdc.pattern="{pattern}" acdc.sparsity={1 - int(n) / int(m):g}'
            )
        try:
            re.compile(pattern)
        except re.error as error:
            raise ConfigError(f"acdc.patterns has {pattern!r}, not a regex ({error})") from None
    require(c.histogram_bins >= 1, f"acdc.histogram_bins={c.histogram_bins} must be >= 1")
    acdc_schedule(c, epochs=t.epochs)

    validate_run(cfg)
    check_engine(cfg)
