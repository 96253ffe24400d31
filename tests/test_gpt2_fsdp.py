"""`distributed=fsdp2` in the GPT-2 pipeline, 2 gloo processes on CPU under torchrun: a run
equals the DDP run of the same config, checkpoints through DCP, resumes after SIGUSR2."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    ROOT,
    _load_entry_point,
    _subprocess_env,
    compose_cfg,
    final_params,
    logged_steps,
    read_records,
    tiny_overrides,
)

from horst_sparse.gpt2.config import validate
from horst_sparse.training.config import ConfigError
from horst_sparse.training.test_pacing import SECONDS_PER_STEP

pytestmark = pytest.mark.usefixtures("quiet_single_threaded")

train_gpt2 = _load_entry_point("train_gpt2")  # the Hydra entry point (`main`)


def torchrun(overrides: list[str], run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "train_gpt2.py"),
        *overrides,
        f"hydra.run.dir={run_dir}",
    ]


def run_two_processes(overrides: list[str], run_dir: Path) -> dict:
    done = subprocess.run(
        torchrun(overrides, run_dir), env=_subprocess_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


def without_markers(run_dir: Path) -> list[dict]:
    """The log without checkpoint markers, whose paths differ between ddp and fsdp2."""
    return [r for r in read_records(run_dir) if r.get("event") != "checkpoint"]


BOTH_STRATEGIES = """
import sys
from pathlib import Path

from horst_sparse.compose import compose
from horst_sparse.gpt2.run import run
from horst_sparse.pipeline import get
from horst_sparse.training.distributed import shutdown_distributed

configs, out, overrides = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
for strategy in ("ddp", "fsdp2"):  # one after the other in the same two processes: one launch
    cfg = compose(get("gpt2"), [*overrides, f"distributed={strategy}"], config_dir=configs)
    run(cfg, run_dir=f"{out}/{strategy}")
shutdown_distributed()
"""


@pytest.mark.parametrize(
    "optimizer",
    ["adamw", pytest.param("horst", marks=pytest.mark.slow)],  # horst: its plain path (HORST_FUSED=0)
)
def test_fsdp2_run_equals_ddp_run_of_the_same_config(pydoc_dir, tmp_path, optimizer):
    """Sharded weights are all-gathered bitwise and gradients reduced in the same order, so
    without gradient clipping (whose norm FSDP2 sums shard by shard: ~1e-6 apart after a few
    steps) the weights, losses and perplexities are exactly DDP's. Accumulation over two
    micro-batches, a periodic evaluation and a DCP checkpoint before the end included."""
    overrides = tiny_overrides(
        pydoc_dir,
        f"optimizer={optimizer}",
        "train.grad_clip=0",
        "train.max_steps=4",
        "train.micro_batch_size=1",
        "train.eval_interval=2",
        "train.checkpoint_interval=2",
        "prune.sparsities=[0.0,0.5]",
    )
    script = tmp_path / "both.py"
    script.write_text(BOTH_STRATEGIES)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        str(ROOT / "configs"),
        str(tmp_path),
        *overrides,
    ]
    done = subprocess.run(command, env=_subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ddp, fsdp2 = (json.loads((tmp_path / s / "summary.json").read_text()) for s in ("ddp", "fsdp2"))

    assert (fsdp2["train"]["world_size"], fsdp2["train"]["distributed"]) == (2, "fsdp2")
    assert sorted(p.name for p in (tmp_path / "fsdp2").glob("ckpt_*")) == ["ckpt_00000002.dcp", "ckpt_00000004.dcp"]
    expected, actual = final_params(tmp_path / "ddp"), final_params(tmp_path / "fsdp2")  # the DCP folder read whole
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name
    assert fsdp2["ppl"] == ddp["ppl"]
    assert (tmp_path / "fsdp2" / "perplexity.md").read_text() == (tmp_path / "ddp" / "perplexity.md").read_text()
    assert without_markers(tmp_path / "fsdp2") == without_markers(tmp_path / "ddp")


def worker_pids(torchrun_pid: int) -> list[int]:
    """The processes torchrun started (its children)."""
    return [int(pid) for pid in Path(f"/proc/{torchrun_pid}/task/{torchrun_pid}/children").read_text().split()]


@pytest.mark.slow
def test_fsdp2_run_resumes_after_sigusr2_from_its_dcp_checkpoint_as_if_never_stopped(pydoc_dir, tmp_path):
    # No periodic checkpoint: the DCP folder the signal writes is the only one.
    overrides = tiny_overrides(
        pydoc_dir,
        "optimizer=adamw",
        "distributed=fsdp2",
        "train.max_steps=12",
        "train.micro_batch_size=1",
        "train.checkpoint_interval=0",
        "train.log_interval=1",
        "train.eval_interval=6",
        "prune.sparsities=[0.0,0.5]",
    )
    reference = run_two_processes(overrides, tmp_path / "reference")

    run_dir = tmp_path / "preempted"
    # Steps of 0.5 s or more (the test suite's pacing): still training when the signal comes, however
    # fast the machine. The reference and the requeued run are not paced.
    child = subprocess.Popen(
        torchrun(overrides, run_dir),
        env={**_subprocess_env(), SECONDS_PER_STEP: "0.5"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 240
    while len(logged_steps(run_dir)) < 3 and child.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    for pid in worker_pids(child.pid):  # what SLURM does: every task gets it
        os.kill(pid, signal.SIGUSR2)
    _, stderr = child.communicate(timeout=240)
    assert re.search(r"exitcode\s*:\s*3", stderr), stderr[-3000:]  # both workers exited for requeue
    (checkpoint,) = run_dir.glob("ckpt_*")
    stopped_at = int(re.search(r"ckpt_(\d+)\.dcp$", checkpoint.name).group(1))
    assert 3 <= stopped_at < 12 and not (run_dir / "summary.json").exists()

    resumed = run_two_processes(overrides, run_dir)  # the requeued job
    assert logged_steps(run_dir) == list(range(1, 13))  # each step once
    assert without_markers(run_dir) == without_markers(tmp_path / "reference")
    expected, actual = final_params(tmp_path / "reference"), final_params(run_dir)
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name
    assert resumed["ppl"] == reference["ppl"]


def test_fsdp2_on_one_process_is_one_line_naming_torchrun(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train_gpt2.py", "distributed=fsdp2", f"hydra.run.dir={tmp_path / 'run'}"])
    with pytest.raises(SystemExit) as exit_info:
        train_gpt2.main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: distributed=fsdp2 shards the model over processes and this run has one; launch it with "
        "torchrun --nproc_per_node=N (N >= 2), or use distributed=ddp"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["distributed=fsdp2", "compile=true"],
            "compile=true is not supported with distributed=fsdp2; use compile=false or distributed=ddp",
        ),
        (["distributed=zero3"], "distributed='zero3' is unknown; use ddp or fsdp2"),
    ],
)
def test_unsupported_distributed_settings_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg(overrides), world_size=2)
    assert str(error.value) == message
