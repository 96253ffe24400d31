"""The reproducible CPU mode (horst_sparse.cpu_mode): pinned before torch in every process that
imports horst_sparse first, read back from the libraries, required by the embedded recipes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from horst_sparse import cpu_mode

ROOT = Path(__file__).resolve().parents[1]
needs_avx2 = pytest.mark.skipif(bool(cpu_mode.missing_cpu_flags()), reason="the mode needs AVX2 and FMA")
# a matrix product (MKL), GELU (oneDNN) and layer norm (ATen) of fixed inputs, hashed
KERNELS = """
import hashlib, horst_sparse, torch
torch.manual_seed(0)
a, b = torch.randn(257, 511), torch.randn(511, 383)
out = torch.nn.functional.layer_norm(torch.nn.functional.gelu(a @ b), (383,))
print(hashlib.sha256(out.numpy().tobytes()).hexdigest())
"""


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in cpu_mode.PINS and k != cpu_mode.MODE_VARIABLE}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**environment, **env}, capture_output=True, text=True, check=True
    )


@needs_avx2
def test_the_test_processes_run_in_the_reproducible_mode():
    state = cpu_mode.state()
    assert state["reproducible"], cpu_mode.problem()
    assert (state["mkl_cbwr"], state["aten_capability"]) == ("0x10003", "AVX2")


@needs_avx2
def test_the_pins_are_read_back_from_the_libraries_not_assumed():
    code = "import torch, horst_sparse.cpu_mode as m; print(m.problem())"
    late = run_python(code)  # torch first: too late to pin
    assert "torch was imported before horst_sparse pinned it" in late.stdout
    # a launcher's worker that loads numpy first, from a pinned parent's environment, is pinned
    inherited = run_python(
        "import numpy, horst_sparse, torch, horst_sparse.cpu_mode as m; print(m.problem())", **cpu_mode.PINS
    )
    assert inherited.stdout.strip() == "None"
    native = run_python(
        "import horst_sparse, torch, horst_sparse.cpu_mode as m; print(m.problem())", HORST_CPU_MODE="native"
    )
    assert "HORST_CPU_MODE=native" in native.stdout
    # native under a pinned parent: the pins it inherited are dropped, each library chooses again
    code = "import horst_sparse, torch, horst_sparse.cpu_mode as m; print(m.state()['mkl_cbwr'])"
    assert run_python(code, HORST_CPU_MODE="native", **cpu_mode.PINS).stdout.strip() != "0x10003"


@pytest.mark.skipif("avx512f" not in Path("/proc/cpuinfo").read_text(), reason="an AVX-512 CPU shows the change")
def test_on_an_avx512_cpu_the_mode_changes_the_bits_of_torchs_kernels():
    pinned = run_python(KERNELS).stdout
    assert pinned == run_python(KERNELS).stdout  # deterministic
    assert pinned != run_python(KERNELS, HORST_CPU_MODE="native").stdout


@needs_avx2
def test_a_recipe_that_requires_the_mode_refuses_to_start_outside_it_in_one_line(tmp_path):
    line = [
        sys.executable,
        "train_vit.py",
        "experiment=smoke_vit",
        "logging.mode=disabled",
        f"hydra.run.dir={tmp_path}",
    ]
    done = subprocess.run(
        line, cwd=ROOT, env={**os.environ, "HORST_CPU_MODE": "native"}, capture_output=True, text=True
    )
    assert done.returncode != 0
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith(
        "error: reproducible_cpu=true, but the reproducible CPU mode is not in force (HORST_CPU_MODE=native"
    )
    assert "Traceback" not in done.stderr


def test_the_mode_needs_a_fixed_thread_count(tmp_path):
    line = [sys.executable, "train_gpt2.py", "experiment=smoke_gpt2", "cpu_threads=null", f"hydra.run.dir={tmp_path}"]
    done = subprocess.run(line, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0 and "reproducible_cpu=true needs a fixed cpu_threads" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unknown_mode_is_one_line():
    done = subprocess.run(
        [sys.executable, "-c", "import horst_sparse"],
        cwd=ROOT,
        env={**os.environ, "HORST_CPU_MODE": "fast"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and done.stderr.strip() == (
        "error: HORST_CPU_MODE='fast': use reproducible (the default) or native"
    )
