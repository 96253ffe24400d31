"""horst_sparse.training.run_log: JSONL metrics, summary, resolved config, W&B mode, resume truncation."""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

from horst_sparse.training.run_log import LogLines, RunLogger, labelled_output, progress_bar, wandb_mode


def _steps(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_metrics_summary_and_config_files(tmp_path):
    log = RunLogger(tmp_path, {"lr": 0.1, "nested": {"a": [1, 2]}}, mode="disabled")
    log.log({"loss": 2.5, "bad": float("nan")}, step=1)
    summary = log.summary({"ppl": {"0.5": 12.0}})
    log.close()
    records = _steps(tmp_path)
    assert records[0]["step"] == 1 and records[0]["loss"] == 2.5 and records[0]["bad"] is None
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == {"lr": 0.1, "nested": {"a": [1, 2]}}
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == summary and on_disk["ppl"] == {"0.5": 12.0}
    assert "git_commit" in on_disk and on_disk["run_dir"] == str(tmp_path.resolve())
    import torch

    env = on_disk["environment"]  # what the numbers were computed with
    assert env["versions"]["torch"] == torch.__version__.split("+")[0] and env["versions"]["transformers"]
    assert env["versions"]["hydra-core"] and env["cpu_threads"] == torch.get_num_threads() and env["host"]
    # the CPU's model and the SIMD path torch takes on it: why a rerun elsewhere differs in its last digits
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and env["cpu"] not in ("", "x86_64")


def test_resume_drops_records_after_the_checkpoint(tmp_path):
    log = RunLogger(tmp_path, {}, mode="disabled")
    for step in (1, 2):
        log.log({"loss": step}, step=step)
    log.checkpoint(tmp_path / "ckpt_00000002.pt", step=2)
    log.log({"val": 0.5}, step=2)  # after the checkpoint: recomputed on resume
    log.log({"loss": 3}, step=3)
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "lo')  # cut short by SIGKILL

    resumed = RunLogger(tmp_path, {}, mode="disabled", resume_step=2)
    resumed.log({"val": 0.5}, step=2)
    resumed.close()
    records = _steps(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 2, 2]
    assert records[2]["event"] == "checkpoint" and records[3]["val"] == 0.5


def test_disabled_logger_writes_nothing(tmp_path):
    log = RunLogger(tmp_path / "run", {}, enabled=False)
    log.log({"loss": 1.0}, step=1)
    log.summary({"x": 1})
    log.close()
    assert not (tmp_path / "run").exists()


def test_wandb_mode_precedence(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert wandb_mode(None) == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode(None) == "disabled"
    assert wandb_mode("online") == "online"  # the config wins over the environment
    with pytest.raises(ValueError, match="unknown W&B mode"):
        wandb_mode("sometimes")


def test_wandb_offline_run_is_created_and_continued_on_resume(tmp_path):
    log = RunLogger(tmp_path, {"lr": 0.1}, mode="offline", project="horst-test")
    log.log({"loss": 1.0}, step=1)
    log.close()
    run_id = (tmp_path / "wandb_id.txt").read_text()
    assert list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    resumed = RunLogger(tmp_path, {"lr": 0.1}, mode="offline", project="horst-test", resume_step=1)
    resumed.close()
    assert (tmp_path / "wandb_id.txt").read_text() == run_id


def test_wandb_online_without_an_api_key_is_one_line_with_the_fix(tmp_path, monkeypatch):
    from horst_sparse.training.config import RunError

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc, no wandb settings
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / ".config" / "wandb"))
    with pytest.raises(
        RunError, match=r"W&B could not start a online run \(.*API key.*\): run `wandb login` or set WANDB_API_KEY"
    ):
        RunLogger(tmp_path / "run", {"lr": 0.1}, mode="online", project="horst-test")


def test_progress_in_a_log_file_is_plain_lines_with_the_postfix(capsys):
    """Where stderr is not a terminal (pytest captures it: a pipe, as in a batch job's log),
    the progress bar is one plain line per `set_postfix`, no `\\r` redraws."""
    import sys

    from horst_sparse.training.run_log import LogLines, progress_bar

    assert not sys.stderr.isatty()
    bar = progress_bar(total=20, initial=10, desc="train")
    assert isinstance(bar, LogLines)
    for _ in range(5):
        bar.update()
    bar.set_postfix(loss="3.210", lr="1.00e-03", refresh=False)
    bar.set_description("epoch 1 compressed")
    bar.update()
    bar.set_postfix(loss="3.000")
    bar.write("epoch done")
    progress_bar(total=5, disable=True).set_postfix(loss="1")  # another process's: silent
    bar.close()
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "train: step 15/20 loss 3.210 lr 1.00e-03",
        "epoch 1 compressed: step 16/20 loss 3.000",
        "epoch done",
    ]
    assert "\r" not in out + err


def test_labelled_output_starts_every_line_and_redraw_with_the_runs_label(capsys):
    with labelled_output("vit horst/s0.9/seed0"):
        print("epoch 1\nepoch 2")
        sys.stderr.write("step 1\rstep 2")
        sys.stderr.write(" more\n")
        assert isinstance(progress_bar(total=3), LogLines)  # no tqdm bar fighting another run's on the terminal
    captured = capsys.readouterr()
    assert captured.out == "[vit horst/s0.9/seed0] epoch 1\n[vit horst/s0.9/seed0] epoch 2\n"
    assert captured.err == "[vit horst/s0.9/seed0] step 1\r[vit horst/s0.9/seed0] step 2 more\n"
    print("after")
    assert capsys.readouterr().out == "after\n"


def test_a_run_whose_wandb_service_got_sigterm_closes_in_one_line_without_a_traceback(tmp_path):
    """SLURM's SIGTERM (scancel, preemption) reaches every process of a job, wandb-core too, which
    exits at once: the run's W&B record is closed without it, in one line, and neither the close
    nor wandb's exit hook prints a traceback. A real offline run in a process of its own, its
    real service process signalled."""
    import subprocess

    script = f"""
import os, signal, time
from pathlib import Path
from horst_sparse.training.run_log import RunLogger

log = RunLogger({str(tmp_path)!r}, {{"lr": 0.1}}, mode="offline")
log.log({{"loss": 1.0}}, step=1)
(service,) = [p for p in Path("/proc").glob("[0-9]*") if (p / "stat").is_file()
              and (p / "stat").read_text().split(") ")[1].split()[1] == str(os.getpid())
              and "wandb-core" in (p / "cmdline").read_text()]
os.kill(int(service.name), signal.SIGTERM)
while service.exists() and "Z" not in (service / "stat").read_text().split(") ")[1].split()[0]:
    time.sleep(0.05)
log.log({{"loss": 0.5}}, step=2)
log.close(exit_code=3)
print("closed")
"""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("closed"), done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("W&B:")]
    assert "its service process ended before this run's W&B record was closed" in line
    assert [r["step"] for r in _steps(tmp_path)] == [1, 2]  # the JSONL log holds every step
