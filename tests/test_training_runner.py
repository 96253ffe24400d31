"""horst_sparse.training.runner: the non-finite guard, checkpoints that are never non-finite, the resume
check that lists every changed setting."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, _subprocess_env
from omegaconf import OmegaConf

from horst_sparse.training.checkpoint import CheckpointError, checkpoint_path, save_checkpoint
from horst_sparse.training.config import ConfigError, RunError
from horst_sparse.training.runner import LOCK_FILE, NonFiniteLossError, Run, config_differences, release_run_folder
from horst_sparse.training.schedule import build_lr_scheduler


def tiny_run(tmp_path, **changes) -> Run:
    cfg = OmegaConf.create(
        {
            "pipeline": "gpt2",  # finish() records its numbers (none here) the GPT-2 pipeline's way
            "seed": 0,
            "device": "cpu",
            "precision": "fp32",
            "deterministic": False,
            "compile": False,
            "cpu_threads": None,
            "resume": "auto",
            "resume_override": [],
            "train": {"lr": 0.1, "keep_checkpoints": 2},
            "optimizer": {"weight_decay": 0.01},
            "logging": {"project": "p", "mode": "disabled", "name": None, "group": None, "tags": []},
        }
    )
    cfg.merge_with(OmegaConf.from_dotlist([f"{k}={v}" for k, v in changes.items()]))
    return Run(cfg, tmp_path, validate=lambda cfg, world_size: None, pipeline="test", title="tiny")


def tracked(run: Run):
    model = torch.nn.Linear(2, 2)
    groups = [{"params": [model.weight]}, {"params": [model.bias], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=run.cfg.train.lr, weight_decay=run.cfg.optimizer.weight_decay)
    scheduler = build_lr_scheduler(optimizer, total_steps=10, warmup_steps=2, min_lr=0.0)
    return model, run.restore(model=model, optimizer=optimizer, scheduler=scheduler, lr=run.cfg.train.lr)


def test_finite_loss_passes(tmp_path):
    tiny_run(tmp_path).check_finite(2.5, step=1, hint="train.lr")


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_loss_names_the_last_good_checkpoint(tmp_path, loss):
    run = tiny_run(tmp_path)
    with pytest.raises(NonFiniteLossError, match="Last good checkpoint: none yet") as error:
        run.check_finite(loss, step=3, hint="train.lr")
    assert error.value.step == 3 and error.value.exit_code == 4
    good = save_checkpoint({"step": 1}, checkpoint_path(tmp_path, 1))
    diverged = save_checkpoint({"step": 2}, checkpoint_path(tmp_path, 2))  # the weights that give the loss of step 3
    with pytest.raises(
        NonFiniteLossError,
        match=(
            f"at step 3; stopped before the next checkpoint. ckpt_00000002.pt holds the weights that gave it: kept as "
            f"ckpt_00000002.pt.diverged. Last good checkpoint: {good}. Lower train.lr and continue from it: "
            f".*hydra.run.dir={tmp_path} with the lower value and resume_override=\\[train.lr\\]"
        ),
    ):
        run.check_finite(loss, step=3, hint="train.lr")
    assert not diverged.exists() and (tmp_path / "ckpt_00000002.pt.diverged").is_file()


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


def test_resume_override_puts_the_new_lr_and_hyperparameters_into_effect(tmp_path):
    run = tiny_run(tmp_path)
    _, _ = tracked(run)
    run.save(step=4)
    run.log.close()
    release_run_folder(tmp_path)
    changed = tiny_run(
        tmp_path,
        **{"train.lr": 0.05, "optimizer.weight_decay": 0.5, "resume_override": "[train.lr,optimizer.weight_decay]"},
    )
    model, state = tracked(changed)
    optimizer, scheduler = changed._tracked["optimizer"], changed._tracked["scheduler"]
    # The same point of the schedule as a run started with lr 0.05: warm-up done, cosine at 2 of 8.
    fresh_optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=0.05)
    fresh = build_lr_scheduler(fresh_optimizer, total_steps=10, warmup_steps=2, min_lr=0.0)
    fresh.step_update(4)
    assert [g["lr"] for g in optimizer.param_groups] == [fresh_optimizer.param_groups[0]["lr"]] * 2
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.5, 0.0]  # decay only where there was decay
    assert changed.resume_overrides == [
        {"step": 4, "changes": {"train.lr": [0.1, 0.05], "optimizer.weight_decay": [0.01, 0.5]}}
    ]
    scheduler.step_update(5)
    assert optimizer.param_groups[0]["lr"] < fresh_optimizer.param_groups[0]["lr"]  # still on the new cosine
    changed.save(step=5)  # the history travels with the checkpoints
    assert torch.load(checkpoint_path(tmp_path, 5), weights_only=True)["resume_overrides"] == changed.resume_overrides


def test_resume_override_of_what_shapes_the_run_is_refused(tmp_path):
    run = tiny_run(tmp_path, resume_override="[seed]")
    with pytest.raises(ConfigError, match="resume_override has seed: only train.lr, train.base_lr"):
        tracked(run)


def test_a_run_folder_has_one_live_writer(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from horst_sparse.training.runner import lock_run_folder; "
            f"lock_run_folder(Path({str(tmp_path)!r})); print('locked', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(
            RunError, match=f"run folder {tmp_path} is in use by pid {holder.pid} on .*; wait for that run"
        ):
            tiny_run(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    run = tiny_run(tmp_path)  # the holder died: its lock is taken over
    assert f"pid {__import__('os').getpid()}" in (tmp_path / LOCK_FILE).read_text()
    tracked(run)
    run.finish({"pruning": {"results": []}})
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_corrupt_checkpoint_names_the_one_before_it_and_the_override_that_resumes_from_it(tmp_path):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    run_dir = tmp_path / "seed0_train.lr=0.1,x"  # a folder named after overrides: Hydra must read the path back
    run = tiny_run(run_dir)
    tracked(run)
    run.save(step=1)
    run.save(step=2)
    run.close()
    (run_dir / "ckpt_00000002.pt").write_bytes(b"truncated")
    with pytest.raises(CheckpointError, match="ckpt_00000002.pt is unreadable") as error:
        tracked(tiny_run(run_dir))
    before = run_dir / "ckpt_00000001.pt"
    assert f"the checkpoint before it is {before}: continue from it with resume=" in str(error.value)
    override = re.search(r"continue from it with (resume=.*), or start a new run folder", str(error.value)).group(1)
    resume = OverridesParser.create().parse_override(override).value()
    assert resume == str(before)
    _, state = tracked(tiny_run(run_dir, resume=resume))
    assert state["step"] == 1


def test_an_interrupt_names_the_wandb_folders_a_continued_run_keeps(tmp_path, capsys):
    """Offline, W&B cannot append to a run's folder: the continued run writes the same W&B run
    into a new one and removes the old. The line printed at the interrupt matches the folder
    there is after the run continues (expanded by a real shell)."""
    run = tiny_run(tmp_path, **{"logging.mode": "offline"})
    tracked(run)
    with pytest.raises(SystemExit):
        run.exit_for_requeue(step=1)
    printed = re.search(r"`wandb sync (.+)` uploads whichever is there", capsys.readouterr().out).group(1)
    resumed = tiny_run(tmp_path, **{"logging.mode": "offline"})
    tracked(resumed)
    kept = resumed.log.offline_dir
    resumed.close()
    expanded = subprocess.run(["bash", "-c", f"printf '%s\\n' {printed}"], capture_output=True, text=True, check=True)
    assert expanded.stdout.splitlines() == [str(kept)] and kept.is_dir()


def test_a_misspelt_resume_override_key_is_refused_before_the_run_starts(tmp_path):
    """`train.lrr` passed the runner's prefix check (`train.lr`) and the run resumed with the
    checkpoint's value; the entry point's start-up checks (`check_resume_override`) refuse it."""
    run_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "train_gpt2.py"), "device=cpu", "resume_override=[train.lrr]"]
    result = subprocess.run(
        [*command, f"hydra.run.dir={run_dir}"], env=_subprocess_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "resume_override has train.lrr, which is not a setting; did you mean train.lr?" in result.stderr
    assert not run_dir.exists()
