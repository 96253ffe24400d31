"""training.optim and training.schedule: param groups, optimizer choice, warm-up + cosine."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

import horst
from training.optim import build_optimizer, param_groups
from training.schedule import build_lr_scheduler


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.block = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)


def _cfg(kind, **kw):
    base = {"name": kind, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
    if kind != "adamw":
        base.update(alpha=10.0, beta=0.1, hyperbolic_params="all_2d")
    if kind == "horst":
        base["order"] = "ms"
    return OmegaConf.create({**base, **kw})


def _group_of(optimizer, param):
    return next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))


def test_weight_decay_only_on_matrices():
    model = Tiny()
    groups = param_groups(model, weight_decay=0.1)
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {id(model.embed.weight), id(model.block.weight)}
    assert all("hyperbolic" not in g for g in groups)


@pytest.mark.parametrize("name,cls", [("adamw", torch.optim.AdamW), ("ham", horst.HAM), ("horst", horst.HORST)])
def test_build_optimizer_types_and_hyperparameters(name, cls):
    model = Tiny()
    optimizer = build_optimizer(_cfg(name), model, lr=3e-4, prunable_names=["block.weight"])
    assert type(optimizer) is cls
    group = _group_of(optimizer, model.block.weight)
    assert group["lr"] == 3e-4 and group["betas"] == (0.9, 0.95) and group["weight_decay"] == 0.1
    if name == "adamw":
        assert group["fused"] is True
    else:
        assert group["alpha"] == 10.0 and group["beta"] == 0.1


def test_hyperbolic_params_all_2d_or_prunable():
    model = Tiny()
    all_2d = build_optimizer(_cfg("horst"), model, lr=1e-3, prunable_names=["block.weight"])
    assert _group_of(all_2d, model.embed.weight)["hyperbolic"] is True
    assert _group_of(all_2d, model.block.bias)["hyperbolic"] is False
    prunable = build_optimizer(_cfg("horst", hyperbolic_params="prunable"), model, lr=1e-3, prunable_names=["block.weight"])
    assert _group_of(prunable, model.embed.weight)["hyperbolic"] is False
    assert _group_of(prunable, model.block.weight)["hyperbolic"] is True
    assert _group_of(prunable, model.embed.weight)["weight_decay"] == 0.1  # decay does not depend on it


def test_unknown_choices_are_value_errors():
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        build_optimizer(_cfg("adamw", name="sgd"), Tiny(), lr=1e-3)
    with pytest.raises(ValueError, match="hyperbolic_params 'some'"):
        build_optimizer(_cfg("ham", hyperbolic_params="some"), Tiny(), lr=1e-3)


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
