"""Multiruns through hydra-submitit-launcher with submitit's own executors, as users launch them.

* `hydra/launcher=local`: submitit's local executor runs every cell as a subprocess.
* `hydra/launcher=slurm`: the project's launcher (hydra_plugins/horst_slurm) writes submitit's
  real sbatch script. What the one-node test cluster can show runs through real SLURM
  (tests/test_slurm_cluster.py: arrays, scancel, preemption, requeues, DDP, submit-and-return);
  here, the fake SLURM of tests/fake_slurm.py runs a preset that asks for GPUs, which that node
  does not have, and the presets' sbatch lines are checked without submitting.
The entry points run as subprocesses, exactly as typed on a login node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import QUIET_ENV, ROOT

TINY_GPT2 = [
    "model=gpt2_nano",
    "device=cpu",
    "train.max_steps=6",
    "train.warmup_steps=1",
    "train.batch_size=2",
    "train.micro_batch_size=2",
    "train.log_interval=1",
    "train.eval_interval=0",
    "train.checkpoint_interval=0",
    "eval.max_windows=8",
    "prune.sparsities=[0.0,0.5]",
]
# dense 0, compressed 1, decompressed 2, compressed 3; one update per epoch is enough here.
TINY_VIT = [
    "model=vit_nano",
    "train.epochs=4",
    "train.warmup_epochs=1",
    "acdc.dense_warmup=1",
    "acdc.compressed=1",
    "acdc.decompressed=1",
    "acdc.final_decompressed=1",
    "acdc.final_compressed=1",
    "train.batch_size=256",
    "train.base_batch_size=256",
]


def launch(script: str, *overrides: str, env: dict | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    environment = {**os.environ, **QUIET_ENV, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    result = subprocess.run(
        [sys.executable, str(ROOT / script), "-m", *overrides],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def summaries(sweep_dir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/summary.json"))}


# GPT-2 through submitit also runs in make test-slurm (the real cluster); slow here to keep the suite < 10 min
@pytest.mark.parametrize("script", [pytest.param("train_gpt2.py", marks=pytest.mark.slow), "train_vit.py"])
def test_local_launcher_runs_every_cell_through_submitit(script, pydoc_dir, tmp_path):
    sweep = tmp_path / "sweep"
    overrides = TINY_GPT2 + [f"data.dir={pydoc_dir}"] if script == "train_gpt2.py" else TINY_VIT
    launch(script, "hydra/launcher=local", "optimizer=adamw,horst", *overrides, f"hydra.sweep.dir={sweep}")
    cells = summaries(sweep)
    assert [s["optimizer"]["name"] for s in cells.values()] == ["adamw", "horst"]
    assert all(name.startswith(f"{i}_") for i, name in enumerate(cells))
    logs = list((sweep / ".submitit").rglob("*_log.out"))  # submitit's local executor ran them
    assert len(logs) == 2


@pytest.fixture
def fake_slurm(tmp_path) -> tuple[Path, dict]:
    """sbatch, srun, sacct, squeue and scontrol on PATH (tests/fake_slurm.py); their state folder."""
    bin_dir, state = tmp_path / "bin", tmp_path / "slurm_state"
    bin_dir.mkdir()
    for command in ("sbatch", "srun", "sacct", "squeue", "scontrol"):
        path = bin_dir / command
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT / "tests" / "fake_slurm.py"}" {command} "$@"\n')
        path.chmod(0o755)
    return state, {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SLURM_STATE": str(state)}


def test_slurm_launcher_submits_the_preset_as_one_array_that_completes(fake_slurm, pydoc_dir, tmp_path):
    state, env = fake_slurm
    sweep = tmp_path / "sweep"
    launch(
        "train_gpt2.py",
        "hydra/launcher=slurm",
        "hydra.launcher.gpus_per_node=1",
        "hydra.launcher.partition=gpu",
        "hydra.launcher.account=proj",
        "optimizer=adamw,horst",
        *TINY_GPT2,
        f"data.dir={pydoc_dir}",
        f"hydra.sweep.dir={sweep}",
        env=env,
    )
    (script,) = state.glob("*.sbatch")  # one submission: the whole multirun is one job array
    lines = set(script.read_text().splitlines())
    for line in (
        "#SBATCH --array=0-1%2",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --signal=USR2@300",
        "#SBATCH --time=2880",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
        "#SBATCH --cpus-per-task=12",
        "#SBATCH --mem=256GB",
        "#SBATCH --nodes=1",
    ):
        assert line in lines, line
    assert any(re.match(r"srun .*python.* -u -m submitit.core._submit", line) for line in lines)
    assert [s["optimizer"]["name"] for s in summaries(sweep).values()] == ["adamw", "horst"]
    assert len(list(state.glob("*.state"))) == 2  # two array tasks, each run once
    assert not list(state.glob("*.restarts"))


def test_slurm_presets_ask_for_what_they_say(fake_slurm, tmp_path, monkeypatch):
    """The sbatch scripts of the presets (`slurm`: 4 GPUs, one DDP task per GPU; `slurm_1gpu`;
    `slurm_1gpu` as a CPU job) as submitit writes them, from the composed launcher configs
    through the project launcher's own parameter mapping, without submitting them."""
    from horst_sparse.compose import compose
    from horst_sparse.pipeline import get
    from hydra_plugins.horst_slurm.slurm_launcher import SlurmLauncher

    monkeypatch.setenv("PATH", fake_slurm[1]["PATH"])  # submitit's SLURM executor looks for srun
    expected = {
        ("slurm",): ("--gpus-per-node=4", "--ntasks-per-node=4", "--mem=256GB"),
        ("slurm_1gpu",): ("--gpus-per-node=1", "--ntasks-per-node=1", "--mem=64GB"),
        # sbatch refuses --ntasks-per-node=0: a CPU job is one task and asks for no GPU
        ("slurm_1gpu", "hydra.launcher.gpus_per_node=0"): ("--ntasks-per-node=1", "--mem=64GB"),
    }
    for (preset, *overrides), lines in expected.items():
        cfg = compose(get("gpt2"), [f"hydra/launcher={preset}", *overrides], hydra_node=True)
        launcher = cfg.hydra.launcher
        params = {k: launcher[k] for k in launcher if k not in ("_target_", "submitit_folder", "name")}
        executor = SlurmLauncher(**params, submitit_folder=str(tmp_path / preset)).executor()
        text = executor._executor._make_submission_file_text("python -u -m submitit.core._submit", "uid")
        for line in (*lines, "--time=2880", "--signal=USR2@300"):
            assert f"#SBATCH {line}" in text, (preset, overrides, line)
        assert ("--gpus-per-node" in text) == bool(launcher.gpus_per_node), (preset, overrides)


def test_a_failed_cell_is_recorded_and_the_sweep_goes_on(pydoc_dir, tmp_path):
    """Hydra's default launcher runs cells in one process: a bad cell must not end the sweep."""
    sweep = tmp_path / "sweep"
    environment = {**os.environ, **QUIET_ENV, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train_gpt2.py"),
            "-m",
            "optimizer.alpha=-1,10",
            "optimizer=horst",
            *TINY_GPT2,
            f"data.dir={pydoc_dir}",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "1 cell(s) of this multirun failed" in result.stderr
    (failed,) = sweep.glob("*/failed.json")
    record = json.loads(failed.read_text())
    assert record["status"] == "failed" and record["exit_code"] == 2 and record["pipeline"] == "gpt2"
    assert "alpha" in record["reason"] and record["config"]["optimizer"]["alpha"] == -1
    assert [s["optimizer"]["alpha"] for s in summaries(sweep).values()] == [10]  # the next cell ran


@pytest.mark.parametrize("mode", ["run", "multirun"])
def test_a_run_folder_that_cannot_be_written_is_one_line(mode, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(folder)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a read-only filesystem here (and root ignores permission bits)")
    try:
        key = "hydra.run.dir" if mode == "run" else "hydra.sweep.dir"
        args = (["-m", "seed=0,1"] if mode == "multirun" else []) + [f"{key}={folder}/out"]
        environment = {**os.environ, **QUIET_ENV, "PYTHONPATH": str(ROOT)}
        result = subprocess.run(
            [sys.executable, str(ROOT / "train_gpt2.py"), *args],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"error: {key}={folder}/out cannot be written (Read-only file system); choose a writable folder ({key}=...)"
    ]


@pytest.mark.parametrize("preset", ["slurm", "slurm_1gpu"])
def test_slurm_presets_give_each_task_the_cpus_the_deit_recipe_loads_with(preset):
    """A GPU task runs the training process and the recipe's DataLoader workers: fewer CPUs
    than that starve the GPU (the presets once asked for 8 with 10 workers per GPU)."""
    import yaml

    launcher = yaml.safe_load((ROOT / "configs" / "hydra" / "launcher" / f"{preset}.yaml").read_text())
    recipe = yaml.safe_load((ROOT / "configs" / "vit_recipe" / "deit_imagenet.yaml").read_text())
    assert launcher["cpus_per_task"] >= recipe["data"]["num_workers"] + 1
