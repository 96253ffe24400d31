"""horst_sparse.training.runner: the non-finite guard, checkpoints that are never non-finite, the resume
check that lists every changed setting, resumes that load on the CPU whatever the run's device (on
CUDA too: marker ``gpu``), fast-path fallbacks in summary.json."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, _subprocess_env
from omegaconf import OmegaConf

import horst
from horst import _fast_path
from horst_sparse import pipeline as registry
from horst_sparse.pipeline import Checks, Configs, Pipeline, TuningScore
from horst_sparse.training import checkpoint
from horst_sparse.training.checkpoint import CheckpointError, checkpoint_path, save_checkpoint
from horst_sparse.training.config import ConfigError, RunError
from horst_sparse.training.runner import LOCK_FILE, NonFiniteLossError, Run, config_differences, release_run_folder
from horst_sparse.training.schedule import build_lr_scheduler

# The runner's own pipeline: no checks, no numbers; the registry knows it for this module's tests.
TINY = Pipeline(
    name="tiny",
    run=lambda cfg, *, run_dir: {},
    configs=Configs(register=lambda: None, lr_key="train.lr"),
    checks=Checks(config=lambda cfg, *, world_size: None),
    numbers=lambda config, summary: [],
    tuning=TuningScore("none", "minimize", lambda summary: 0.0),
)


@pytest.fixture(autouse=True)
def tiny_pipeline(monkeypatch):
    monkeypatch.setattr(registry, "_ADDED", {**registry._ADDED, TINY.name: TINY})


def tiny_run(tmp_path, **changes) -> Run:
    cfg = OmegaConf.create(
        {
            "pipeline": "tiny",
            "seed": 0,
            "device": "cpu",
            "precision": "fp32",
            "deterministic": False,
            "compile": False,
            "cpu_threads": None,
            "reproducible_cpu": False,
            "resume": "auto",
            "resume_override": [],
            "train": {"lr": 0.1, "keep_checkpoints": 2},
            "optimizer": {"weight_decay": 0.01},
            "logging": {"project": "p", "mode": "disabled", "name": None, "group": None, "tags": []},
        }
    )
    cfg.merge_with(OmegaConf.from_dotlist([f"{k}={v}" for k, v in changes.items()]))
    return Run(cfg, tmp_path, title="tiny")


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


def test_a_resume_loads_the_checkpoint_on_the_cpu_whatever_the_runs_device(tmp_path, monkeypatch):
    """A GPU run's resume, with the meta device standing in for the GPU: a tensor that the load
    put on the run's device would have no data, so neither the model, the optimizer nor the RNG
    could take it. The checkpoint loads on the CPU; the RNG states restored are CPU ByteTensors
    and the optimizer's `step` stays a CPU tensor, where torch's non-fused AdamW keeps it."""
    run = tiny_run(tmp_path)
    model, _ = tracked(run)
    model(torch.ones(1, 2)).sum().backward()
    run._tracked["optimizer"].step()
    run.save(step=1)
    run.close()
    restored = []
    restore_rng_state = checkpoint.restore_rng_state

    def noting_rng_state(state, generators):
        restored.append(state)
        restore_rng_state(state, generators)

    monkeypatch.setattr(checkpoint, "restore_rng_state", noting_rng_state)
    resumed = tiny_run(tmp_path)
    resumed.device = torch.device("meta")
    model, state = tracked(resumed)
    resumed.close()
    assert state["step"] == 1
    (rng,) = restored
    for tensor in (rng["torch"], rng["numpy"]["state"]["key"], *rng["cuda"]):
        assert tensor.device.type == "cpu"
    assert rng["torch"].dtype == torch.uint8 and all(t.dtype == torch.uint8 for t in rng["cuda"])
    optimizer = resumed._tracked["optimizer"]
    for param in model.parameters():
        assert optimizer.state[param]["step"].device.type == "cpu"
        assert optimizer.state[param]["exp_avg"].device == param.device


def test_a_fast_path_that_fell_back_is_recorded_in_the_summary_and_named_at_the_end(tmp_path, monkeypatch, capsys):
    """horst's compiled path fails (a compiler that raises) and the plain path takes over: the
    run's summary.json lists it (`fast_path_fallbacks`; empty in a run without one) and the run
    ends with one line that says so."""
    run = tiny_run(tmp_path / "fast")
    tracked(run)
    run.finish({"pruning": {"results": []}})
    assert json.loads((tmp_path / "fast" / "summary.json").read_text())["fast_path_fallbacks"] == []
    assert "fast path failed" not in capsys.readouterr().err

    def compiler_that_fails():
        def compiled(*args):
            raise RuntimeError("no compiler here")

        return compiled

    monkeypatch.setattr(_fast_path, "_failed", set())  # this process's record, fresh
    monkeypatch.setattr(_fast_path, "_compiled_kernel", compiler_that_fails)
    run = tiny_run(tmp_path / "fell_back")
    tracked(run)
    param = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))  # not float32: the compiled path, not the C kernel
    param.grad = torch.ones_like(param)
    with pytest.warns(RuntimeWarning, match="the torch.compile fast path failed"):
        horst.HORST([param], lr=0.1, fused=True).step()
    run.finish({"pruning": {"results": []}})
    summary = json.loads((tmp_path / "fell_back" / "summary.json").read_text())
    assert summary["fast_path_fallbacks"] == ["torch.compile"]
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "fast path failed" in line]
    assert line.startswith("warning: horst's fast path failed in this run (torch.compile)")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check on a GPU machine)")
def test_a_cuda_run_resumes_through_the_runner_and_its_steps_after_it_do_not_sync(tmp_path):
    """A requeued GPU run: a HORST run on CUDA checkpoints, a new `Run` resumes it (`Run.restore`,
    the runner's load path) and continues. Checks: the resume runs (the CPU RNG state loads as the
    CPU byte tensor torch needs, not onto the GPU); the CUDA RNG state is restored; the moments are on the GPU and each
    `step` counter a CPU tensor; the continued run equals the uninterrupted one; and the steps after
    the resume run under `torch.cuda.set_sync_debug_mode("error")`: no host sync in the forward,
    backward, HORST's step (the plain path: the fast path's own step is horst's to test) or the
    loss guard. CPU stand-in: the test above with the meta device."""
    cuda = torch.device("cuda")
    batches = [torch.randn(4, 8, device=cuda, generator=torch.Generator(cuda).manual_seed(i)) for i in range(6)]

    def start():
        run = tiny_run(tmp_path, device="cuda")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(cuda)
        optimizer = horst.HORST(model.parameters(), lr=1e-2, weight_decay=0.1, alpha=20.0, beta=0.5, fused=False)
        scheduler = build_lr_scheduler(optimizer, total_steps=10, warmup_steps=2, min_lr=0.0)
        state = run.restore(model=model, optimizer=optimizer, scheduler=scheduler, lr=run.cfg.train.lr)
        return run, model, optimizer, scheduler, state

    def train(run, model, optimizer, scheduler, steps):
        for step in steps:
            loss = model(batches[step]).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step_update(step + 1)
            run.watch_loss(loss, step=step)

    run, model, optimizer, scheduler, _ = start()
    train(run, model, optimizer, scheduler, range(3))
    run.save(step=3)
    rng_at_3 = torch.cuda.get_rng_state()
    train(run, model, optimizer, scheduler, range(3, 6))
    expected = [p.detach().clone() for p in model.parameters()]
    run.close()

    torch.cuda.manual_seed(1234)  # moved on: the resume must put it back
    run, model, optimizer, scheduler, state = start()
    assert state["step"] == 3 and torch.equal(torch.cuda.get_rng_state(), rng_at_3)
    for param in model.parameters():
        assert optimizer.state[param]["step"].device.type == "cpu"
        assert optimizer.state[param]["exp_avg"].device == param.device
    torch.cuda.set_sync_debug_mode("error")
    try:
        train(run, model, optimizer, scheduler, range(3, 6))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    run.check_losses()
    run.close()
    assert all(torch.equal(p, e) for p, e in zip(model.parameters(), expected))
