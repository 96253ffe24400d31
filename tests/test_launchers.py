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
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUIET_ENV, ROOT, logged_steps

from horst_sparse.training.test_pacing import SECONDS_PER_STEP

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


# Through submitit both also run in make test-slurm (the real cluster, CI); slow here to keep the suite < 10 min
@pytest.mark.slow
@pytest.mark.parametrize("script", ["train_gpt2.py", "train_vit.py"])
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
def test_slurm_presets_give_each_task_the_cpus_the_deit_recipe_loads_with(preset, monkeypatch):
    """A GPU task runs the training process and the recipe's DataLoader workers, as many as the
    task's CPUs allow (`${loader_workers:}`): all but the process's own, 10 or more per GPU."""
    import yaml
    from omegaconf import OmegaConf

    import horst_sparse.training.resolvers  # noqa: F401  (registers loader_workers)

    launcher = yaml.safe_load((ROOT / "configs" / "hydra" / "launcher" / f"{preset}.yaml").read_text())
    recipe = OmegaConf.load(ROOT / "configs" / "vit_recipe" / "deit_imagenet.yaml")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", str(launcher["cpus_per_task"]))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)  # srun: one process per task
    assert recipe.data.num_workers == launcher["cpus_per_task"] - 1 >= 10


def paste(line: str, env: dict | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    """`line` run by bash as a user pastes it at the repository root (`python`: the venv's)."""
    path = f"{Path(sys.executable).parent}:{(env or os.environ)['PATH']}"
    environment = {
        **os.environ,
        **QUIET_ENV,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        **(env or {}),
        "PATH": path,
    }
    return subprocess.run(
        ["bash", "-c", line], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout
    )


def wait_until(ready, child: subprocess.Popen, timeout: float = 300) -> None:
    """Until `ready()`, while `child` runs."""
    deadline = time.time() + timeout
    while not ready() and child.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert child.poll() is None, "the sweep ended before it was signalled"


@pytest.mark.slow  # a real multi-process run; make test-all (keeps make test under 10 min on 2 cores)
def test_ctrl_c_in_a_multirun_prints_the_line_that_continues_the_whole_sweep(tmp_path):
    """Two cells in one process (Hydra's basic launcher), the second interrupted; the sweep's
    folder is time-stamped, as by default, and holds `=` and `,`. The printed line, pasted,
    leaves the finished cell as it is and continues the other from its checkpoint: each cell
    in one folder, each step once."""
    steps = [*TINY_VIT, "train.batch_size=32", "train.base_batch_size=32", "train.log_interval=1"]
    steps = [o for o in steps if not o.startswith(("train.batch_size=256", "train.base_batch_size=256"))]
    command = [sys.executable, str(ROOT / "train_vit.py"), "-m", "seed=0,1", *steps]
    command.append(f"hydra.sweep.dir='{tmp_path}/sweep=${{now:%H-%M-%S}},x'")
    # Steps of 0.05 s or more (the test suite's pacing): the second cell's are still training when
    # the interrupt comes, however fast the machine. The pasted line's run is not paced.
    environment = {**os.environ, **QUIET_ENV, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", SECONDS_PER_STEP: "0.05"}
    child = subprocess.Popen(
        command, cwd=ROOT, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    second = lambda: [logged_steps(d) for d in tmp_path.glob("sweep=*/1_*")]  # noqa: E731
    try:
        wait_until(lambda: any(len(s) >= 3 for s in second()), child)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=300)
    finally:
        child.kill()
    assert child.returncode == 3, stderr[-3000:]
    (sweep,) = tmp_path.glob("sweep=*")
    line = stderr.split("continue with: ", 1)[1].splitlines()[0]
    assert " -m " in line and f"hydra.sweep.dir='{sweep}'" in line
    first, interrupted = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert (first / "summary.json").is_file() and not (interrupted / "summary.json").exists()
    (checkpoint,) = interrupted.glob("ckpt_*.pt")

    pasted = paste(line)
    assert pasted.returncode == 0, pasted.stderr[-3000:]
    assert f"{first} holds this run, finished" in pasted.stdout and f"resumed from {checkpoint}" in pasted.stdout
    assert list(tmp_path.glob("sweep=*")) == [sweep]
    assert sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")) == [first, interrupted]
    assert [s["seed"] for s in summaries(sweep).values()] == [0, 1]
    total = logged_steps(first)[-1]
    assert logged_steps(first) == logged_steps(interrupted) == list(range(1, total + 1))


def test_jobs_file_lists_a_cell_submitted_again_once(tmp_path):
    """A sweep submitted again into its folder (to continue it) updates its cells' jobs;
    a sweeper's later batch of other cells is added."""
    from hydra_plugins.horst_slurm.slurm_launcher import JOBS_FILE, write_jobs_file

    def cells(job: int, nums: range) -> list[dict]:
        return [
            {"num": n, "slurm_job_id": f"{job}_{n}", "run_dir": str(tmp_path / f"{n}_cell"), "overrides": [f"seed={n}"]}
            for n in nums
        ]

    write = lambda c: write_jobs_file(tmp_path, pipeline="vit", submitit_folder="f/%j", cells=c)  # noqa: E731
    write(cells(100, range(2)))
    write(cells(200, range(2)))  # the same command again, into the same folder
    write(cells(300, range(2, 3)))  # a sweeper's next batch
    listed = json.loads((tmp_path / JOBS_FILE).read_text())
    assert [(c["run_dir"], c["slurm_job_id"]) for c in listed["cells"]] == [
        (str(tmp_path / "0_cell"), "200_0"),
        (str(tmp_path / "1_cell"), "200_1"),
        (str(tmp_path / "2_cell"), "300_2"),
    ]
    assert listed["pipeline"] == "vit" and listed["submitit_folder"] == "f/%j"


@pytest.mark.slow  # a real multi-process run; make test-all (keeps make test under 10 min on 2 cores)
def test_a_cell_slurm_cancels_names_its_last_checkpoint_and_the_line_that_continues_it(fake_slurm, pydoc_dir, tmp_path):
    """`scancel` as SLURM does it: SIGTERM to the job's task. The run checkpoints and exits,
    printing the line that continues the sweep (through SLURM); the launcher records the failed
    cell with that checkpoint (path and step) and the line that continues the cell alone, which
    pasted finishes the run; the multirun ends with the line that continues the sweep."""
    state, env = fake_slurm
    sweep = tmp_path / "sweep"
    steps = [o for o in TINY_GPT2 if not o.startswith("train.max_steps=")] + ["train.max_steps=60"]
    command = [sys.executable, str(ROOT / "train_gpt2.py"), "-m", "hydra/launcher=slurm_1gpu"]
    command += ["hydra.launcher.gpus_per_node=0", *steps, f"data.dir={pydoc_dir}", f"hydra.sweep.dir={sweep}"]
    # Steps of 0.2 s or more (the test suite's pacing): the cell is still training when SIGTERM comes,
    # however fast the machine. The pasted line's run is not paced.
    paced = {SECONDS_PER_STEP: "0.2"}
    environment = {**os.environ, **QUIET_ENV, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env, **paced}
    child = subprocess.Popen(
        command, cwd=ROOT, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    cell = lambda: next(sweep.glob("0_*"), sweep / "none")  # noqa: E731
    try:
        wait_until(lambda: len(logged_steps(cell())) >= 3, child)
        (pid,) = state.glob("*.0.pid")  # the job's one task (one cell: not an array)
        os.kill(int(pid.read_text()), signal.SIGTERM)
        _, stderr = child.communicate(timeout=300)
    finally:
        child.kill()
    assert child.returncode == 1, stderr[-3000:]
    sweep_line = stderr.split("continue the sweep (its finished cells are kept) with: ", 1)[1].splitlines()[0]
    assert sweep_line.startswith("python train_gpt2.py -m hydra/launcher=slurm_1gpu ")
    run_dir = cell()
    checkpoint = max(run_dir.glob("ckpt_*.pt"))
    record = json.loads((run_dir / "failed.json").read_text())
    assert record["checkpoint"] == str(checkpoint) and record["checkpoint_step"] == int(checkpoint.stem.split("_")[1])
    (log,) = sweep.glob(".submitit/*/*_0_log.err")  # the run's own stderr, on the node
    assert f"stopped by SIGTERM: checkpoint written; continue with: {sweep_line}\n" in log.read_text()

    pasted = paste(record["continue"], env=env)
    assert pasted.returncode == 0, pasted.stderr[-3000:]
    assert f"resumed from {checkpoint}" in pasted.stdout
    assert logged_steps(run_dir) == list(range(1, 61)) and (run_dir / "summary.json").is_file()


# ---- the CPU preset and horst-sparse status's failed cells (one block: another engineer adds above) ----


def test_slurm_cpu_preset_asks_for_one_task_its_cpus_and_memory_and_no_gpu(fake_slurm, tmp_path, monkeypatch):
    """`hydra/launcher=slurm_cpu`, as submitit writes its sbatch script through the project
    launcher (the real cluster runs it: tests/test_slurm_cluster.py)."""
    import yaml

    from horst_sparse.compose import compose
    from horst_sparse.pipeline import get
    from hydra_plugins.horst_slurm.slurm_launcher import SlurmLauncher

    monkeypatch.setenv("PATH", fake_slurm[1]["PATH"])  # submitit's SLURM executor looks for srun
    preset = yaml.safe_load((ROOT / "configs" / "hydra" / "launcher" / "slurm_cpu.yaml").read_text())
    launcher = compose(get("vit"), ["hydra/launcher=slurm_cpu"], hydra_node=True).hydra.launcher
    params = {k: launcher[k] for k in launcher if k not in ("_target_", "submitit_folder", "name")}
    executor = SlurmLauncher(**params, submitit_folder=str(tmp_path / "cpu")).executor()
    text = executor._executor._make_submission_file_text("python -u -m submitit.core._submit", "uid")
    for line in ("--ntasks-per-node=1", f"--cpus-per-task={preset['cpus_per_task']}", f"--mem={preset['mem_gb']}GB"):
        assert f"#SBATCH {line}\n" in text, line
    assert "--gpus-per-node" not in text and "--gres" not in text
    assert preset["cpus_per_task"] <= 8 and preset["mem_gb"] <= 8  # fits an ordinary CPU node, and the test cluster's


def test_sweep_status_names_a_failed_cells_last_checkpoint_and_the_line_that_continues_it(tmp_path, capsys):
    """What a failed cell's `failed.json` names of its resumption is printed below its row, as
    the record has it (`last_checkpoint` {path, step} or `checkpoint` and `checkpoint_step`;
    `continue`, the cell alone, here); a record without those fields prints the row alone. With no
    cell pending or running, the line that continues the whole sweep (jobs.json's) comes last."""
    from hydra_plugins.horst_slurm import status

    records = {
        "0_a": {"last_checkpoint": {"path": "/r/0_a/ckpt_00000040.pt", "step": 40}, "continue": "python x.py a=1"},
        "1_b": {"checkpoint": "/r/1_b/ckpt_00000007.pt", "checkpoint_step": 7, "continue": "python x.py 'b=a b'"},
        "2_c": {"checkpoint": None, "checkpoint_step": None, "continue": None},
        "3_d": {},  # written before the fields existed
    }
    cells = []
    for num, (name, fields) in enumerate(records.items()):
        (tmp_path / name).mkdir()
        failed = {"status": "failed", "reason": f"reason {name}", **fields}
        (tmp_path / name / "failed.json").write_text(json.dumps(failed))
        cells.append({"num": num, "slurm_job_id": f"9_{num}", "run_dir": str(tmp_path / name), "config": {}})
    (tmp_path / "4_e").mkdir()
    (tmp_path / "4_e" / "failed.json").write_text("{")  # cut off as it was written
    cells.append({"num": 4, "slurm_job_id": "9_4", "run_dir": str(tmp_path / "4_e"), "config": {}})
    sweep_line = "python train_vit.py -m hydra/launcher=slurm_cpu seed=0,1 hydra.sweep.dir=/s"
    manifest = {"pipeline": "vit", "submitit_folder": "f/%j", "command": sweep_line, "cells": cells}
    (tmp_path / "jobs.json").write_text(json.dumps(manifest))

    assert status.main([str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "0_a  failed   reason 0_a",
        "    last checkpoint: /r/0_a/ckpt_00000040.pt (step 40)",
        "    continue this cell alone, on this machine: python x.py a=1",
        "1_b  failed   reason 1_b",
        "    last checkpoint: /r/1_b/ckpt_00000007.pt (step 7)",
        "    continue this cell alone, on this machine: python x.py 'b=a b'",
        "2_c  failed   reason 2_c",
        "    last checkpoint: none (the run starts again from its first step)",
        "3_d  failed   reason 3_d",
        "4_e  failed   (no reason readable in its failed.json)",
        "0 done, 5 failed, 0 running, 0 pending of 5 cells",
        f"continue the sweep (its finished cells are kept) with: {sweep_line}",
    ]
