"""training.runner: the non-finite guard, checkpoints that are never non-finite, the resume
check that lists every changed setting."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from training.checkpoint import CheckpointError, checkpoint_path, save_checkpoint
from training.runner import NonFiniteLossError, Run, config_differences
from training.schedule import build_lr_scheduler


def tiny_run(tmp_path, **changes) -> Run:
    cfg = OmegaConf.create({
        "seed": 0, "device": "cpu", "precision": "fp32", "deterministic": False, "compile": False,
        "cpu_threads": None, "resume": "auto", "train": {"lr": 0.1, "keep_checkpoints": 2},
        "logging": {"project": "p", "mode": "disabled", "name": None, "group": None, "tags": []},
    })  # fmt: skip
    cfg.merge_with(OmegaConf.from_dotlist([f"{k}={v}" for k, v in changes.items()]))
    return Run(cfg, tmp_path, validate=lambda cfg, world_size: None)


def tracked(run: Run):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = build_lr_scheduler(optimizer, total_steps=10, warmup_steps=0, min_lr=0.0)
    return model, run.restore(model=model, optimizer=optimizer, scheduler=scheduler)


def test_finite_loss_passes(tmp_path):
    tiny_run(tmp_path).check_finite(2.5, step=1, hint="train.lr")


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_loss_names_the_last_good_checkpoint(tmp_path, loss):
    run = tiny_run(tmp_path)
    with pytest.raises(NonFiniteLossError, match="Last good checkpoint: none yet") as error:
        run.check_finite(loss, step=3, hint="train.lr")
    assert error.value.step == 3 and error.value.exit_code == 4
    path = save_checkpoint({"step": 2}, checkpoint_path(tmp_path, 2))
    with pytest.raises(NonFiniteLossError, match=f"at step 3; .* Last good checkpoint: {path}. Lower train.lr .*hydra.run.dir="):
        run.check_finite(loss, step=3, hint="train.lr")


def test_non_finite_weights_are_never_checkpointed(tmp_path):
    run = tiny_run(tmp_path)
    model, _ = tracked(run)
    run.save(step=1)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match="weights are not finite at step 2; no checkpoint written"):
        run.save(step=2)
    assert sorted(p.name for p in tmp_path.glob("ckpt_*")) == ["ckpt_00000001.pt"]


def test_resume_refuses_other_settings_listing_each(tmp_path):
    run = tiny_run(tmp_path)
    tracked(run)
    run.save(step=1)
    run.log.close()
    changed = tiny_run(tmp_path, **{"train.lr": 0.2, "seed": 3, "logging.project": "q"})
    with pytest.raises(CheckpointError, match=r"other settings \(seed: 0 -> 3; train.lr: 0.1 -> 0.2\)"):
        tracked(changed)
    same = tiny_run(tmp_path, **{"logging.project": "q", "cpu_threads": 1})  # not what is trained
    _, state = tracked(same)
    assert state["step"] == 1


def test_config_differences_walks_nested_sections():
    old = {"a": 1, "b": {"c": [1, 2], "d": "x"}, "gone": 1}
    new = {"a": 1, "b": {"c": (1, 2), "d": "y"}, "added": 2}
    assert config_differences(old, new) == ["added: <absent> -> 2", "b.d: x -> y", "gone: 1 -> <absent>"]
    assert config_differences(old, new, ignore=("b", "gone", "added")) == []
