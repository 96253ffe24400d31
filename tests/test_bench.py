"""The benchmarks the README shows, shrunk: each runs, measures its reference in the same run and
prints a ratio per row (the committed outputs are in results/bench/)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT


def bench(*arguments: str, timeout: int = 300) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / arguments[0]), *arguments[1:]],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def rows(text: str) -> dict[str, list[str]]:
    """The table's rows by their first column (columns are 2+ spaces apart; a name holds single ones)."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line.strip()) for line in lines[1:])}


@pytest.mark.slow  # HAM's and HORST's first steps compile a 51-entry call each: minutes on 2 cores
def test_the_host_overhead_case_steps_every_optimizer_beside_adamw_foreach():
    out = bench("optimizer_step.py", "--case", "host-overhead", "--rounds", "1", "--steps", "1", timeout=1200)
    assert "148 tensors" in out and "target <= 1.20" in out
    table = rows(out)
    assert set(table) == {"AdamW foreach", "HAM (fast path)", "HORST (fast path)"}
    assert all(float(values[-4]) > 0 for values in table.values())  # a ratio against the same round's AdamW


@pytest.mark.parametrize("workers", [1])
def test_the_imagenet_loader_benchmark_compares_the_pipeline_with_reforked_workers(workers):
    out = bench(
        "imagenet_loader.py", "--workers", str(workers), "--rounds", "1", "--classes", "2", "--per-class", "4",
        "--batch", "4",
    )  # fmt: skip
    assert "reference (workers forked every epoch" in out and "pipeline (persistent workers" in out
    assert "from the cached list" in out


@pytest.mark.slow  # ~3 min: four real runs
def test_the_cpu_mode_bench_times_each_run_in_both_modes():
    out = bench("cpu_mode.py", "--rounds", "1", "--gpt2-steps", "8")
    table = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row[0].strip() for row in table] == ["vit (mnist1d, 40 epochs)", "gpt2 (pydoc, 8 updates)"]
    assert all(float(row[3]) > 0 for row in table)


@pytest.mark.slow  # ~2 min: four multiruns of two short runs, two workers each
def test_the_engine_cost_bench_compares_both_engines_as_the_study_runs_them():
    out = bench("engine_cost.py", "--quick")
    assert "through the joblib launcher, two workers" in out and "reproducible CPU mode True" in out
    table = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    costs, finals = table[1:3], table[4:]
    assert [row[0].strip() for row in costs] == ["vit (mnist1d, 4 epochs)", "gpt2 (pydoc, 4 updates)"]
    assert all(float(row[5]) > 0 for row in costs)  # runs per hour, fast / reference
    assert [row[1:3] for row in finals] == [[" 10-11 ", " top-1 "], [" 10-11 ", " dense perplexity "]]


def test_the_readmes_make_test_time_is_the_one_command_time_wrote():
    """The README's minutes for `make test` are results/bench/make_test.txt's, not typed."""
    record = (ROOT / "results" / "bench" / "make_test.txt").read_text()
    assert record.startswith("# command: make test\n")
    minutes = re.search(r"^minutes: ([\d.]+)$", record, re.M).group(1)
    assert f"`make test`\ntook {minutes} minutes on 2 cores" in (ROOT / "README.md").read_text()


def test_command_time_writes_a_time_only_for_a_command_that_succeeds(tmp_path):
    out = tmp_path / "time.txt"
    ok = [sys.executable, str(ROOT / "bench" / "command_time.py"), "--out", str(out), "--"]
    done = subprocess.run([*ok, sys.executable, "-c", "print('3 passed in 0.1s')"], capture_output=True, text=True)
    assert done.returncode == 0 and out.read_text() == done.stdout
    assert "# its last line: 3 passed in 0.1s\nminutes: 0.0\n" in out.read_text()
    out.unlink()
    failed = subprocess.run([*ok, sys.executable, "-c", "raise SystemExit(3)"], capture_output=True, text=True)
    assert failed.returncode == 1 and not out.exists() and "exited 3: no time written" in failed.stderr


@pytest.mark.slow  # ~35 s: the pipeline's step timed in a subprocess (make test keeps under 10 min on 2 cores)
def test_the_train_step_bench_times_the_pipelines_step_and_checks_its_mfu():
    tiny = ("train_step.py", "--layers", "1", "--width", "32", "--context", "16", "--batch", "2", "--rounds", "2")
    out = bench(*tiny, "--warmup", "1", "--threads", "1", "--peak-tflops", "1", "--mfu-target", "1e-6")
    assert "vocabulary padded to 50257, compile off" in out and "target >= 1e-06" in out  # CPU: no padding
    table = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in out.splitlines() if line.startswith("| ")}
    assert set(table) == {"optimizer", "adamw", "ham", "horst"}
    assert all(float(values[-1]) > 1e-6 for name, values in table.items() if name != "optimizer")  # the MFU
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / tiny[0]),
            *tiny[1:],
            "--warmup",
            "0",
            "--peak-tflops",
            "1",
            "--mfu-target",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and "bench/train_step.py: adamw's MFU" in done.stderr
