"""Where CUDA does not work, and which GPU a process takes (horst_sparse.training.env), and
`make gpu-check`'s verdict.

No GPU here: the CPU stand-ins monkeypatch what only a GPU machine has (torch.cuda's answers, an
old driver's version, a GPU machine's pytest and benchmark output); the `gpu` tests run the same
checks on a real device."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, _load_entry_point

from horst_sparse.training import env
from horst_sparse.training.config import RunError
from horst_sparse.training.env import MIN_DRIVER, select_device


@pytest.fixture
def cuda_broken(monkeypatch):
    """torch's answers on a machine where CUDA does not work (e.g. a driver older than the
    wheel's CUDA), torch being a CUDA 13.0 build."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")


def test_device_cuda_with_a_driver_too_old_names_the_driver_torchs_cuda_and_the_fix(cuda_broken, monkeypatch):
    monkeypatch.setattr(env, "nvidia_driver", lambda: "550.54.15")  # a CUDA 12.4 driver
    with pytest.raises(RunError) as error:
        select_device("cuda")
    message = str(error.value)
    assert "\n" not in message
    assert "NVIDIA driver 550.54.15 is too old" in message and "CUDA 13.0" in message
    assert f">= {MIN_DRIVER[13]}" in message and "device=cpu" in message
    assert "make venv TORCH=cu126" in message  # a CUDA 12 build runs on this driver


def test_a_driver_too_old_for_cuda_12_too_is_not_sent_to_the_cuda_12_build(cuda_broken, monkeypatch):
    monkeypatch.setattr(env, "nvidia_driver", lambda: "470.256.02")
    with pytest.raises(RunError) as error:
        select_device("cuda")
    assert "update the driver" in str(error.value) and "TORCH=cu126" not in str(error.value)


@pytest.mark.parametrize(
    ("driver", "cuda", "says"),
    [
        (None, "13.0", "no NVIDIA driver answers here"),
        ("580.95.05", "13.0", "CUDA sees no GPU (NVIDIA driver 580.95.05"),
        (None, None, "is a CPU-only build"),
    ],
)
def test_device_cuda_without_working_cuda_says_why_in_one_line(monkeypatch, driver, cuda, says):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(env, "nvidia_driver", lambda: driver)
    with pytest.raises(RunError, match=r"^device=cuda, but .*" + says.replace("(", r"\(")):
        select_device("cuda")


def test_device_auto_takes_the_cpu_where_cuda_does_not_work(cuda_broken):
    assert select_device("auto") == torch.device("cpu")


@pytest.mark.slow  # imports the whole ViT pipeline
def test_a_run_on_cuda_without_cuda_stops_at_start_up_in_one_line(cuda_broken, tmp_path, monkeypatch, capsys):
    """The GPU recipes say device: cuda; here the default ViT run with device=cuda shows what
    they do where CUDA does not work: one line, exit 2, before any data or model is built."""
    train_vit = _load_entry_point("train_vit")
    monkeypatch.setattr(sys, "argv", ["train_vit.py", "device=cuda", f"hydra.run.dir={tmp_path / 'run'}"])
    with pytest.raises(SystemExit) as exit_info:
        train_vit.main()
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: device=cuda, but ") and "CUDA 13.0" in line


@pytest.mark.parametrize(("visible", "local_rank", "index"), [(1, 3, 0), (4, 3, 3), (8, 0, 0)])
def test_local_rank_takes_a_gpu_this_task_sees(monkeypatch, visible, local_rank, index):
    """SLURM binding one GPU per task shows each task only its own, as cuda:0 (mocked: no GPU here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    assert select_device("cuda", local_rank=local_rank) == torch.device("cuda", index)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check on a GPU machine)")
def test_a_task_bound_to_one_gpu_trains_on_it_whatever_its_local_rank():
    code = (
        "import torch; from horst_sparse.training.env import select_device; "
        "d = select_device('cuda', local_rank=3); print(d, torch.ones(2, device=d).sum().item())"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cuda:0", "2.0"]


# ---- make gpu-check -------------------------------------------------------------------------------
BENCH_HEADER = (
    "# bench/optimizer_step.py --rounds 5 --steps 3 --device cuda\n"
    "# s/step: median over 5 interleaved rounds of 3 steps; ...; target <= {target} on the fast path\n"
    f"{'optimizer':<38} {'baseline':<38} {'s/step':>7} {'ratio':>6} {'min':>7} {'max':>7} {'1st step (s)':>12}\n"
)


def bench_row(name: str, ratio: float) -> str:
    return f"{name:<38} {'AdamW fused':<38} {0.01:7.4f} {ratio:6.2f} {0.01:7.4f} {0.01:7.4f} {1.0:12.1f}\n"


# A stand-in for a GPU machine's python as the gpu-check recipe calls it: CUDA works, pytest
# prints $FAKE_PYTEST, the optimizer benchmark prints $FAKE_BENCH.
FAKE_PYTHON = """#!/bin/sh
case "$1 $2" in
  "-m pytest"*) cat "$FAKE_PYTEST" ;;
  "bench/optimizer_step.py"*) cat "$FAKE_BENCH" ;;
  "bench/train_step.py"*) echo "train step: fine"; case "$*" in *"--mfu-target 0.40"*) exit "${FAKE_TRAIN_RC:-0}" ;; esac; exit 9 ;;
  -c*) echo "torch fake CUDA 13.0" ;;
esac
"""


def make_gpu_check(
    tmp_path: Path, *, python: str | None = None, pytest_out: str = "", bench: str = "", train_rc: int = 0
):
    (tmp_path / "pytest.txt").write_text(pytest_out)
    (tmp_path / "bench.txt").write_text(bench)
    command = ["make", "-s", "-o", ".venv/.installed", "gpu-check", f"GPU_REPORT={tmp_path / 'gpu.md'}"]
    if python:
        command.append(f"PY={python}")
    environ = {
        **os.environ,
        "FAKE_PYTEST": str(tmp_path / "pytest.txt"),
        "FAKE_BENCH": str(tmp_path / "bench.txt"),
        "FAKE_TRAIN_RC": str(train_rc),  # bench/train_step.py's status: 1 where an MFU is under its target
    }
    return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # make, then a python that imports torch
def test_gpu_check_fails_at_once_where_cuda_does_not_work(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA works here: make gpu-check would run the whole check")
    result = make_gpu_check(tmp_path)
    assert result.returncode != 0
    assert "make gpu-check: no CUDA: " in result.stderr and "CUDA" in result.stderr
    assert not (tmp_path / "gpu.md").exists()  # nothing ran


PASSED = "PASSED tests/test_horst_gpu.py::test_a\n1 passed\n"


@pytest.mark.parametrize(
    ("pytest_out", "ratio", "target", "train_rc", "verdict"),
    [
        (PASSED, 1.06, "1.10", 0, None),
        (PASSED + "SKIPPED [1] tests/test_horst_gpu.py:9: needs CUDA\n", 1.06, "1.10", 0, "gpu tests skipped"),
        (PASSED, 1.15, "1.10", 0, "a fast-path ratio of bench/optimizer_step.py is over its target"),
        (PASSED, 1.15, "1.20", 0, None),
        (PASSED, 1.06, "1.10", 1, "bench/train_step.py failed (an MFU under 0.40"),
    ],
)
def test_gpu_check_fails_on_a_skipped_gpu_test_a_ratio_over_target_or_an_mfu_under_it(
    tmp_path, pytest_out, ratio, target, train_rc, verdict
):
    """A GPU machine's output (mocked: no GPU here), against the target the benchmark's header
    states; foreach AdamW's 3.30 is listed for scale, not a fast path, so never over target."""
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    bench = (
        BENCH_HEADER.format(target=target) + bench_row("AdamW foreach", 3.30) + bench_row("HORST (fast path)", ratio)
    )
    result = make_gpu_check(tmp_path, python=str(python), pytest_out=pytest_out, bench=bench, train_rc=train_rc)
    report = (tmp_path / "gpu.md").read_text()
    assert "HORST (fast path)" in report and "train step: fine" in report
    if verdict is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0 and f"make gpu-check failed: {verdict}" in result.stderr


@pytest.fixture
def no_compiler(tmp_path, monkeypatch):
    """A PATH holding python alone: no gcc, g++, clang or cc (the slim image without build tools)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bin_dir))
    for name in ("CC", "CXX"):
        monkeypatch.delenv(name, raising=False)
    return bin_dir


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compile_without_a_compiler_says_which_one_is_missing(no_compiler, device):
    problem = env.compile_problem(device)
    assert problem.startswith("torch.compile needs a C") and problem.endswith("or use compile=false")
    assert ("Triton" in problem) == (device == "cuda")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compile_finds_a_compiler_on_the_path(no_compiler, device):
    for name in ("gcc", "g++"):  # the real compilers, linked into the PATH the search reads
        (no_compiler / name).symlink_to(shutil.which(name, path=os.defpath) or pytest.skip(f"no {name} here"))
    assert env.compile_problem(device) is None


def test_gpt2_with_compile_and_no_compiler_stops_at_start_up_in_one_line(no_compiler, tmp_path, monkeypatch, capsys):
    """Without the check, the first training step fails inside Inductor with a long traceback."""
    train_gpt2 = _load_entry_point("train_gpt2")
    run_dir = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["train_gpt2.py", "compile=true", "device=cpu", f"hydra.run.dir={run_dir}"])
    with pytest.raises(SystemExit) as exit_info:
        train_gpt2.main()
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: compile=true, but torch.compile needs a C++ compiler")
    assert not run_dir.exists()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compile_without_pythons_headers_says_so_beside_the_compiler_check(monkeypatch, tmp_path, device):
    """Triton and Inductor build Python extension modules: without Python.h (a python3.11 without
    its -dev package) the first compiled step fails deep inside them."""
    assert env.python_headers().is_file()  # this machine's, where sysconfig says
    monkeypatch.setattr(env.sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    problem = env.compile_problem(device)
    assert problem == (
        f"torch.compile needs Python's headers and {tmp_path / 'Python.h'} is missing; install them "
        f"(apt install python{env.sysconfig.get_python_version()}-dev) or use compile=false"
    )


# ------------------------------------------------------------------------------ /dev/shm

DEIT_BATCH = env.image_batch_bytes(128, 3, 224)  # one worker's DeiT batch of 128 images


def test_a_deit_batch_is_77_mb():
    assert DEIT_BATCH == 128 * 3 * 224 * 224 * 4 and round(DEIT_BATCH / 1e6) == 77
    assert env.image_batch_bytes(2, 1, (1, 40)) == 2 * 40 * 4


def test_workers_whose_batches_do_not_fit_in_dockers_64_mb_of_shared_memory_stop_in_one_line(monkeypatch):
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(env.shutil, "disk_usage", lambda path: usage._replace(total=64 * 2**20, free=64 * 2**20))
    problem = env.shared_memory_problem(DEIT_BATCH, workers=8, prefetch=4)
    assert "\n" not in problem
    assert problem.startswith("8 DataLoader workers hold 4 batches of 74 MiB each in /dev/shm (2352 MiB)")
    assert "64 MiB free" in problem and "--ipc=host" in problem and "--ulimit memlock=-1" in problem
    assert env.shared_memory_problem(DEIT_BATCH, workers=0, prefetch=4) is None  # no workers: no shared memory
    monkeypatch.setattr(env.shutil, "disk_usage", lambda path: usage._replace(free=3 * 2**30))
    assert env.shared_memory_problem(DEIT_BATCH, workers=8, prefetch=4) is None  # --ipc=host: the host's
    assert env.shared_memory_problem(DEIT_BATCH, workers=8, prefetch=4, processes=2) is not None  # two ranks, one node


def test_a_missing_shared_memory_folder_is_no_problem(tmp_path):
    assert env.shared_memory_problem(DEIT_BATCH, workers=2, prefetch=4, path=tmp_path / "none") is None


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 64 MB tmpfs, Docker's /dev/shm (needs root: mount)."""
    folder = tmp_path / "shm"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", folder], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield folder
    subprocess.run(["umount", folder], check=True)


def test_the_check_reads_a_real_64_mb_tmpfs(small_tmpfs):
    assert shutil.disk_usage(small_tmpfs).free == 64 * 2**20
    problem = env.shared_memory_problem(DEIT_BATCH, workers=1, prefetch=4, path=small_tmpfs)
    assert f"in {small_tmpfs} (294 MiB), which has 64 MiB free" in problem
    assert env.shared_memory_problem(env.image_batch_bytes(16, 3, 224), workers=1, prefetch=4, path=small_tmpfs) is None


@pytest.mark.slow  # imports the whole ViT pipeline
def test_a_vit_run_whose_workers_do_not_fit_in_shared_memory_stops_at_start_up_in_one_line(
    tmp_path, monkeypatch, capsys
):
    """The default ViT run with two workers in a 64 MB /dev/shm (Docker's, as disk_usage reports
    it): one line naming the fix and exit 2, before a worker starts or a batch is made."""
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(env.shutil, "disk_usage", lambda path: usage._replace(total=64 * 2**20, free=64 * 2**20))
    train_vit = _load_entry_point("train_vit")
    argv = ["train_vit.py", "data.num_workers=2", "model.img_size=224", "model.patch_size=16", "train.batch_size=512"]
    monkeypatch.setattr(sys, "argv", [*argv, f"hydra.run.dir={tmp_path / 'run'}"])
    with pytest.raises(SystemExit) as exit_info:
        train_vit.main()
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: 2 DataLoader workers hold 4 batches of ") and "--ipc=host" in line
