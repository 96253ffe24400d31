"""End-to-end tests of train_gpt2.py on CPU: train, prune, evaluate; kill and resume; DDP."""

from __future__ import annotations

import json
import math
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, _load_entry_point, _subprocess_env, compose_cfg, final_params, read_records, tiny_overrides

from horst_sparse.gpt2.data import DatasetNotPreparedError
from horst_sparse.gpt2.run import run
from horst_sparse.training.checkpoint import CheckpointError
from horst_sparse.training.runner import NON_FINITE_EXIT_CODE

pytestmark = pytest.mark.usefixtures("quiet_single_threaded")

train_gpt2 = _load_entry_point("train_gpt2")  # the Hydra entry point (`main`)


def test_tiny_end_to_end(pydoc_dir, tmp_path):
    run_dir = tmp_path / "run"
    summary = run(compose_cfg(tiny_overrides(pydoc_dir)), run_dir=run_dir)

    assert summary["optimizer"]["name"] == "horst" and summary["train"]["tokens_trained"] == 12 * 4 * 32
    results = {r["sparsity"]: r for r in summary["pruning"]["results"]}
    assert set(results) == {0.0, 0.5, 0.9}
    assert results[0.9]["measured_sparsity"] == pytest.approx(0.9, abs=1e-3)
    assert results[0.0]["measured_sparsity"] == 0.0
    assert summary["pruning"]["windows"] == 64 and summary["pruning"]["tokens"] == 64 * 32
    # Training helped: the dense model beats the uniform prediction over 50257 words.
    assert results[0.0]["val_loss"] < math.log(50257) - 0.3
    assert all(r["ppl"] == pytest.approx(torch.tensor(r["val_loss"]).exp().item()) for r in results.values())

    records = read_records(run_dir)
    train_steps = [r["step"] for r in records if "train/loss" in r]
    assert train_steps == [2, 4, 6, 8, 10, 12]
    assert [r["step"] for r in records if "val/loss" in r] == [4, 8, 12]
    assert any("prune/ppl@0.9" in r for r in records)
    histogram = json.loads((run_dir / "weight_histogram.json").read_text())
    assert sum(histogram["counts"]) == summary["model"]["prunable_parameters"]  # no zero weights after training
    for name in ("summary.json", "perplexity.json", "perplexity.md", "config.yaml"):
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "summary.json").read_text())["ppl"]["0.9"] == results[0.9]["ppl"]
    assert "| 0.90 |" in (run_dir / "perplexity.md").read_text()
    # keep_checkpoints=2 of the checkpoints at 4, 8, 12
    assert sorted(p.name for p in run_dir.glob("ckpt_*.pt")) == ["ckpt_00000008.pt", "ckpt_00000012.pt"]


def test_kill_and_resume_matches_uninterrupted_run(pydoc_dir, tmp_path, capsys):
    overrides = tiny_overrides(pydoc_dir, "train.max_steps=20", "train.eval_interval=10")
    reference = tmp_path / "reference"
    run(compose_cfg(overrides), run_dir=reference)

    run_dir = tmp_path / "interrupted"
    command = [sys.executable, str(ROOT / "train_gpt2.py"), *overrides, f"hydra.run.dir={run_dir}"]
    child = subprocess.Popen(command, env=_subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not list(run_dir.glob("ckpt_*.pt")) and child.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()[-2000:]
    assert not (run_dir / "summary.json").exists(), "the run finished before it could be killed"

    # Resume in this process (same single-threaded kernels as the subprocess).
    run(compose_cfg(overrides), run_dir=run_dir)
    assert "resumed from" in capsys.readouterr().out

    expected, actual = final_params(reference), final_params(run_dir)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    assert read_records(run_dir) == read_records(reference)
    ppl = lambda d: json.loads((d / "summary.json").read_text())["ppl"]  # noqa: E731
    assert ppl(run_dir) == ppl(reference)


@pytest.mark.slow  # ~20 s: two gloo processes; FSDP2 against DDP stays in the default suite
def test_ddp_two_processes_match_one_process(pydoc_dir, tmp_path):
    overrides = tiny_overrides(pydoc_dir, "train.micro_batch_size=2", "train.max_steps=6", "prune.sparsities=[0.0,0.5]")
    single = run(compose_cfg(overrides), run_dir=tmp_path / "single")

    # Hydra's default time-stamped run folder: the processes must agree on one.
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "train_gpt2.py"),
        *overrides,
    ]
    done = subprocess.run(command, env=_subprocess_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (summary_file,) = (tmp_path / "outputs").rglob("summary.json")
    run_dir = summary_file.parent
    ddp = json.loads(summary_file.read_text())

    assert ddp["train"]["world_size"] == 2
    assert ddp["pruning"]["tokens"] == single["pruning"]["tokens"]
    for s in ("0", "0.5"):
        assert ddp["ppl"][s] == pytest.approx(single["ppl"][s], rel=1e-4)
    expected, actual = final_params(tmp_path / "single"), final_params(run_dir)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-5)


def test_non_finite_loss_exits_with_the_command_that_recovers_and_that_command_works(
    pydoc_dir, tmp_path, monkeypatch, capsys
):
    run_dir = tmp_path / "run"
    # alpha * lr = 1e5 after the warm-up: the mirror step blows the weights up within a few updates.
    overrides = tiny_overrides(
        pydoc_dir, "train.lr=1.0", "train.min_lr=0.1", "optimizer.alpha=1e5", "train.checkpoint_interval=1"
    )
    monkeypatch.setattr(sys, "argv", ["train_gpt2.py", *overrides, f"hydra.run.dir={run_dir}"])
    with pytest.raises(SystemExit) as exit_info:
        train_gpt2.main()
    assert exit_info.value.code == NON_FINITE_EXIT_CODE == 4
    err = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", capsys.readouterr().err)  # without tqdm's cursor moves
    (message,) = [line for line in err.splitlines() if line.startswith("error:")]
    checkpoints = sorted(run_dir.glob("ckpt_*.pt"))  # those left after the diverged one was set aside
    assert checkpoints, "expected a checkpoint before the blow-up"
    assert "training loss is nan" in message or "training loss is inf" in message or "weights are not finite" in message
    assert f"Last good checkpoint: {checkpoints[-1]}" in message
    assert all(torch.isfinite(p).all() for p in final_params(run_dir).values())  # the one it names is good
    assert not (run_dir / "summary.json").exists()
    stopped_at = int(checkpoints[-1].stem.split("_")[1])

    # What the message says: the same command, a lower lr (alpha), and resume_override.
    command = message.split("continue from it: ")[1].split(" with the lower value")[0]
    assert command.startswith("python train_gpt2.py ") and f"hydra.run.dir={run_dir}" in command
    assert "resume_override=[train.lr]" in message
    argv = [a for a in shlex.split(command)[1:] if not a.startswith(("train.lr=", "optimizer.alpha="))]
    monkeypatch.setattr(
        sys,
        "argv",
        [
            *argv,
            "train.lr=1e-3",
            "train.min_lr=1e-4",
            "optimizer.alpha=10",
            "resume_override=[train.lr,train.min_lr,optimizer.alpha]",
        ],
    )
    train_gpt2.main()
    summary = json.loads((run_dir / "summary.json").read_text())
    (change,) = summary["resume_overrides"]
    assert change == {
        "step": stopped_at,
        "changes": {"train.lr": [1.0, 1e-3], "train.min_lr": [0.1, 1e-4], "optimizer.alpha": [1e5, 10.0]},
    }
    assert summary["optimizer"]["lr"] == 1e-3 and summary["optimizer"]["alpha"] == 10.0  # the config as it ends
    assert all(math.isfinite(p) for p in summary["ppl"].values())
    records = read_records(run_dir)
    assert {"step": stopped_at, "event": "resume_override", "changes": change["changes"]} in records
    lrs = [r["train/lr"] for r in records if "train/lr" in r and r["step"] > stopped_at]
    assert lrs and max(lrs) <= 1e-3


def test_cli_config_error_is_one_line_and_nonzero(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train_gpt2.py", "train.lr=-1", f"hydra.run.dir={tmp_path / 'run'}"])
    with pytest.raises(SystemExit) as exit_info:
        train_gpt2.main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: train.lr=-1.0 must be positive"
    assert not (tmp_path / "run").exists()  # a refused run leaves no folder behind
    assert not list(tmp_path.glob("*.log"))


def test_resume_refuses_a_checkpoint_of_another_optimizer_or_model_before_loading_it(pydoc_dir, tmp_path):
    run_dir = tmp_path / "run"
    run(compose_cfg(tiny_overrides(pydoc_dir, "train.max_steps=4")), run_dir=run_dir)
    other = compose_cfg(tiny_overrides(pydoc_dir, "train.max_steps=8", "optimizer=adamw"))
    with pytest.raises(
        CheckpointError, match=r"other settings \(.*optimizer.name: horst -> adamw; .*train.max_steps: 4 -> 8\)"
    ):
        run(other, run_dir=run_dir)
    wider = compose_cfg(tiny_overrides(pydoc_dir, "train.max_steps=4", "model.n_embd=64"))  # weights would not fit
    with pytest.raises(CheckpointError, match=r"other settings \(model.n_embd: 32 -> 64\)"):
        run(wider, run_dir=run_dir)


def test_missing_dataset_names_the_prepare_command(tmp_path):
    cfg = compose_cfg(["data.name=slimpajama", f"data.dir={tmp_path / 'nothing'}"])
    with pytest.raises(DatasetNotPreparedError, match="scripts/prepare_slimpajama.py --out"):
        run(cfg, run_dir=tmp_path / "run")
