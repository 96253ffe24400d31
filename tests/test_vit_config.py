"""ViT config composition, the DeiT paper-cell presets, and validation: one clear error each."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from horst_sparse.compose import ComposeError, compose
from horst_sparse.paths import CONFIGS
from horst_sparse.pipeline import get
from horst_sparse.training.config import ConfigError, check_resume_override
from horst_sparse.vit.config import acdc_schedule, scaled_lr, validate


def _compose(*overrides):
    return compose(get("vit"), overrides)


def test_embedded_default_composes_and_validates():
    cfg = _compose()
    validate(cfg, world_size=1)
    assert cfg.data.name == "digits" and cfg.model.img_size == 8 and cfg.model.patch_size == 4
    assert cfg.optimizer.name == "horst"  # alpha/beta: test_alpha_beta_defaults_are_the_sweep_picks
    assert cfg.acdc.sparsity == 0.9 and cfg.train.epochs == 40
    schedule = acdc_schedule(cfg.acdc, epochs=cfg.train.epochs)
    # The official 100-epoch schedule scaled by 0.4.
    assert schedule.prune_epochs == (4, 8, 12, 16, 20, 24, 28, 34)
    assert schedule.restore_epochs == (6, 10, 14, 18, 22, 26, 30)


CELLS = [
    (size, width, heads, sparsity)
    for size, width, heads in [("tiny", 192, 3), ("small", 384, 6), ("base", 768, 12)]
    for sparsity in (70, 80, 90)
]


# Each (model, sparsity) preset once, the optimizers taking turns (composition is the cost).
@pytest.mark.parametrize("cell,optimizer", [(cell, ("adamw", "ham", "horst")[i % 3]) for i, cell in enumerate(CELLS)])
def test_every_deit_table_cell_has_a_preset(cell, optimizer):
    size, width, heads, sparsity = cell
    cfg = _compose(f"experiment=deit_{size}_acdc_s{sparsity}", f"optimizer={optimizer}", "data.root=/data/imagenet")
    validate(cfg, world_size=8)
    assert cfg.model.timm_name == f"deit_{size}_patch16_224"
    assert (cfg.model.embed_dim, cfg.model.num_heads, cfg.model.depth, cfg.model.drop_path) == (width, heads, 12, 0.1)
    assert cfg.acdc.sparsity == sparsity / 100 and cfg.acdc.scope == "global"
    assert cfg.optimizer.name == optimizer and cfg.optimizer.weight_decay == 0.05
    # docs/design.md §4: the DeiT recipe.
    t, a = cfg.train, cfg.aug
    assert (t.epochs, t.batch_size, t.warmup_epochs, t.warmup_lr, t.min_lr) == (300, 1024, 5, 1e-6, 1e-5)
    assert scaled_lr(t) == pytest.approx(5e-4 * 1024 / 512)
    assert a.auto_augment == "rand-m9-mstd0.5-inc1" and a.re_prob == 0.25
    assert (a.mixup, a.cutmix, a.smoothing) == (0.8, 1.0, 0.1)
    assert cfg.data.name == "imagefolder" and cfg.data.repeated_aug == 3
    schedule = acdc_schedule(cfg.acdc, epochs=t.epochs)
    assert schedule.prune_epochs == (30, 60, 90, 120, 150, 180, 210, 255)
    assert schedule.restore_epochs == (45, 75, 105, 135, 165, 195, 225)
    if optimizer == "ham":
        assert (cfg.optimizer.alpha, cfg.optimizer.beta) == (200.0, 1e-3)


@pytest.mark.parametrize(
    "override,message",
    [
        ("acdc.sparsity=1.0", r"acdc.sparsity=1.0 must be in \[0, 1\)"),
        ("train.epochs=41", "acdc phases do not fit train.epochs=41: .*nearest totals that fit: 40 or 44"),
        ("optimizer.alpha=-1", r"optimizer=horst \(horst.HORST\): .*alpha"),
        ("train.base_lr=-1", "train.base_lr=-1.0 must be positive"),
        ("model.arch=gpt2", "model=vit_digits is not a ViT preset"),
        ("model.patch_size=3", "model.img_size=8 must be a multiple of model.patch_size=3"),
        ("model.timm_name=resnet_9000", "model.timm_name='resnet_9000' is not a timm model"),
        ("data.name=coco", "data.name='coco' is unknown; use digits or imagefolder"),
        ("aug.auto_augment=rand-q9", "aug.auto_augment='rand-q9' is not a timm augmentation policy"),
        ("aug.mixup=0.8", r"train.batch_size=63 over 1 processes must give an even batch"),
        ("acdc.scope=local", "acdc.scope='local' is unknown"),
        ("train.warmup_epochs=40", r"train.warmup_epochs=40 must be in \[0, train.epochs\)"),
        ("logging.mode=sometimes", "logging.mode='sometimes' is unknown"),
    ],
)
def test_bad_values_are_one_clear_error(override, message):
    overrides = [override] + (["train.batch_size=63"] if override.startswith("aug.mixup") else [])
    with pytest.raises(ConfigError, match=message):
        validate(_compose(*overrides), world_size=1)


def test_batch_must_split_over_processes():
    with pytest.raises(ConfigError, match="train.batch_size=64 must be a multiple of the 3 processes"):
        validate(_compose(), world_size=3)


def test_deit_bs_global_batch_on_one_gpu_is_refused_naming_the_accumulation_that_fits():
    """slurm_1gpu gives the recipe's 1024 images per update to one process: more DeiT-B than one
    GPU holds in a pass, so the run stops at start-up with the fix; DeiT-S/Ti state no limit."""
    cfg = _compose("experiment=deit_base_acdc_s70", "data.root=/data/imagenet")
    with pytest.raises(ConfigError, match=r"puts 1024 images of deit_base in one pass, .* pass train.accum_steps=2"):
        validate(cfg, world_size=1)
    validate(cfg, world_size=2)
    validate(_compose("experiment=deit_base_acdc_s70", "data.root=/data/imagenet", "train.accum_steps=2"), world_size=1)
    validate(_compose("experiment=deit_small_acdc_s70", "data.root=/data/imagenet"), world_size=1)


@pytest.mark.parametrize(
    "override", ["acdc.sparsty=0.5", "train.epochs=many", "model=no_such_model", "vit_recipe=none"]
)
def test_typos_fail_at_composition(override):
    with pytest.raises(ComposeError):
        _compose(override)


@pytest.mark.parametrize("optimizer", ["horst", "ham"])
def test_alpha_beta_defaults_are_the_sweep_picks(optimizer):
    """configs/tuned/vit/digits.yaml (results/tuning/; a section per optimizer) holds the embedded
    recipe's picks; the DeiT recipe keeps the published (HAM) and library (HORST) values
    (configs/tuned/vit/deit_imagenet.yaml). Where each value comes from: tests/test_config_precedence.py."""
    picked = OmegaConf.load(CONFIGS / "tuned" / "vit" / "digits.yaml")[optimizer]
    imagenet = OmegaConf.load(CONFIGS / "tuned" / "vit" / "deit_imagenet.yaml")[optimizer]
    assert (picked.alpha, picked.beta) != (imagenet.alpha, imagenet.beta)
    cfg = _compose(f"optimizer={optimizer}")
    assert (cfg.optimizer.alpha, cfg.optimizer.beta) == (picked.alpha, picked.beta)
    cell = _compose(f"optimizer={optimizer}", "experiment=deit_small_acdc_s80")
    assert (cell.optimizer.alpha, cell.optimizer.beta) == (imagenet.alpha, imagenet.beta)


@pytest.mark.parametrize(
    "override,message",
    [
        ("optimizer.lr_=1e-3", "optimizer.lr_ is not an optimizer setting: the learning rate is train.base_lr (> 0)"),
        ("optimizer.lr=-1e-3", "optimizer.lr is not an optimizer setting: the learning rate is train.base_lr (> 0)"),
        (
            "optimizer=ham optimizer.max_nrom=1",
            "optimizer=ham (horst.HAM): optimizer.max_nrom is not a setting of the class "
            "(did you mean optimizer.max_norm?); fix the optimizer.* setting",
        ),
        (
            "resume_override=[train.lr]",
            "resume_override has train.lr, which is not a setting; the learning rate is train.base_lr",
        ),
    ],
)
def test_a_vit_lr_key_anywhere_else_names_train_base_lr(override, message):
    """ViT's learning rate is train.base_lr (scaled by the batch size): an lr key under optimizer or in
    resume_override is refused in one line that names it."""
    import re

    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        validate(_compose(*override.split()), world_size=1)


def test_vit_resume_override_takes_its_own_keys():
    cfg = _compose("resume_override=[train.base_lr,train.min_lr,optimizer.alpha]")
    check_resume_override(cfg)
    validate(cfg, world_size=1)
