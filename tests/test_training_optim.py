"""horst_sparse.training.optim and horst_sparse.training.schedule: param groups, every configs/optimizer/ file, warm-up + cosine."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm.optim
import torch
from omegaconf import OmegaConf

import horst
from horst_sparse.training.config import ConfigError
from horst_sparse.training.optim import build_optimizer, param_groups
from horst_sparse.training.schedule import build_lr_scheduler


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.block = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)


CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "optimizer"
CLASSES = {
    "adamw": torch.optim.AdamW,
    "ham": horst.HAM,
    "horst": horst.HORST,
    "horst_lion": horst.HORSTLion,
    "horst_sgd": horst.HORSTSGD,
    "lion": timm.optim.Lion,
    "sgd": torch.optim.SGD,
}


@pytest.fixture(scope="module")
def optimizer_config(compose):
    """optimizer_config(kind, **kw): the real configs/optimizer/<kind>.yaml with `kw` changed, its
    `${hparams.*}` values resolved against the GPT-2 pipeline's composed tuned node (as a run that
    selects it reads them: `hparams` is the section of its `tuned_as`, the optimizer)."""
    tuned = compose("gpt2", [])["tuned"]

    def config(kind, **kw):
        node = OmegaConf.create(
            {
                "tuned": tuned,
                "tuned_as": kind,
                "hparams": "${tuned.${tuned_as}}",
                "optimizer": OmegaConf.load(CONFIGS / f"{kind}.yaml"),
            }
        )
        node.optimizer.merge_with(kw)
        return OmegaConf.create(OmegaConf.to_container(node.optimizer, resolve=True))

    return config


def _group_of(optimizer, param):
    return next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))


def test_weight_decay_only_on_matrices():
    model = Tiny()
    groups = param_groups(model, weight_decay=0.1)
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {id(model.embed.weight), id(model.block.weight)}
    assert all("hyperbolic" not in g for g in groups)


def test_every_optimizer_config_is_one_file_that_builds_its_class(optimizer_config):
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == sorted(CLASSES)
    for name, cls in CLASSES.items():
        model = Tiny()
        optimizer = build_optimizer(optimizer_config(name), model, lr=3e-4, prunable_names=["block.weight"])
        assert type(optimizer) is cls, name
        settings = OmegaConf.to_container(optimizer_config(name))
        group = _group_of(optimizer, model.block.weight)
        assert group["lr"] == 3e-4 and group["weight_decay"] == settings["weight_decay"], name
        assert _group_of(optimizer, model.block.bias)["weight_decay"] == 0.0, name
        for key, value in settings.items():
            if not key.startswith("_") and key not in ("name", "hyperbolic_params", "weight_decay"):
                assert group[key] == (tuple(value) if isinstance(group[key], tuple) else value), (name, key)
        assert ("hyperbolic" in group) == ("hyperbolic_params" in settings), name
        loss = model.block(model.embed(torch.tensor([1, 2]))).square().sum()
        loss.backward()
        optimizer.step()  # every class takes a step over the groups it was given


def test_hyperbolic_params_all_2d_or_prunable(optimizer_config):
    model = Tiny()
    all_2d = build_optimizer(optimizer_config("horst"), model, lr=1e-3, prunable_names=["block.weight"])
    assert _group_of(all_2d, model.embed.weight)["hyperbolic"] is True
    assert _group_of(all_2d, model.block.bias)["hyperbolic"] is False
    prunable = build_optimizer(
        optimizer_config("horst", hyperbolic_params="prunable"), model, lr=1e-3, prunable_names=["block.weight"]
    )
    assert _group_of(prunable, model.embed.weight)["hyperbolic"] is False
    assert _group_of(prunable, model.block.weight)["hyperbolic"] is True
    assert (
        _group_of(prunable, model.embed.weight)["weight_decay"]
        == _group_of(all_2d, model.embed.weight)["weight_decay"]
        > 0
    )  # decay does not depend on it


@pytest.mark.parametrize(
    "change,message",
    [
        ({"hyperbolic_params": "some"}, "optimizer.hyperbolic_params='some' is unknown; use all_2d or prunable"),
        ({"_target_": "horst.NoSuchOptimizer"}, "optimizer._target_=horst.NoSuchOptimizer: Error locating target"),
        ({"alhpa": 3.0}, r"optimizer=horst \(horst.HORST\): .*alhpa.*; fix the optimizer.\* setting"),
        ({"alpha": -1.0}, r"optimizer=horst \(horst.HORST\): .*alpha"),
    ],
)
def test_bad_settings_are_one_config_error(change, message, optimizer_config):
    with pytest.raises(ConfigError, match=message):
        build_optimizer(optimizer_config("horst", **change), Tiny(), lr=1e-3)


def test_a_name_that_is_not_the_class_is_refused_in_one_line(tmp_path, optimizer_config):
    """`optimizer.name` labels every record and table, so it must be the class's (`name=sgd` over
    horst.HORST would run HORST and table it as sgd); every shipped file passes."""
    import subprocess
    import sys

    for kind in CLASSES:
        build_optimizer(optimizer_config(kind), Tiny(), lr=1e-3)
    with pytest.raises(ConfigError, match=r"^optimizer.name=sgd but optimizer._target_=horst.HORST runs HORST"):
        build_optimizer(optimizer_config("horst", name="sgd"), Tiny(), lr=1e-3)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "train_gpt2.py", "optimizer.name=sgd", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert (
        done.stderr.strip().splitlines()[-1].startswith("error: optimizer.name=sgd but optimizer._target_=horst.HORST")
    )
    assert not (tmp_path / "run" / "summary.json").exists()


def test_warmup_then_cosine_to_min_lr():
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_lr_scheduler(optimizer, total_steps=12, warmup_steps=2, min_lr=0.1, warmup_lr=0.0)
    lrs = [optimizer.param_groups[0]["lr"]]
    for update in range(1, 14):
        scheduler.step_update(update)
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs[:3] == [0.0, 0.5, 1.0]
    assert lrs[7] == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the cosine
    assert lrs[12] == pytest.approx(0.1) and lrs[13] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:]))


def test_deit_exempts_what_timm_exempts_from_weight_decay():
    import timm

    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=8, depth=1, num_classes=3
    )
    groups = param_groups(model, weight_decay=0.05)
    decayed = {
        n for n, p in model.named_parameters() for g in groups if g["weight_decay"] > 0 for q in g["params"] if q is p
    }
    assert {"pos_embed", "cls_token"} <= set(model.no_weight_decay())
    assert "pos_embed" not in decayed and "cls_token" not in decayed and "patch_embed.proj.weight" in decayed
