"""Sweeps through the real SLURM cluster of scripts/slurm_cluster.sh (one node; slurmctld,
slurmd, slurmdbd accounting), submitted as a user types them: `train_gpt2.py -m
hydra/launcher=slurm_1gpu ...` on a login node, the project's launcher (hydra_plugins/horst_slurm)
over submitit's SLURM executor. SLURM itself does what it does to jobs: `scancel`, preemption by
a job on a higher partition (SIGTERM, or SIGUSR2 with it where the cluster sends the user
signal; then SLURM's own requeue), a requeue of a finished job.
Skipped, with the command that starts the cluster, where it is not running (tests/conftest.py).

The jobs are CPU jobs (`hydra.launcher.gpus_per_node=0`: one task, no GPU asked for) of the
smallest GPT-2; the tests mostly wait on SLURM (a requeued job starts again ~12 s later). The
`slurm_cpu` preset runs as it is; the 4-GPU preset as a CPU job asks more CPUs than the node has
and pends (PartitionConfig), as `horst-sparse plan` warns and `horst-sparse status` shows. A cell that
must still train when SLURM acts on it is paced (`sweep(..., seconds_per_step=...)`), so no
verdict depends on how fast the machine trains.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
import yaml
from conftest import (
    HORST_SPARSE,
    QUIET_ENV,
    ROOT,
    SLURM_CLUSTER_HINT,
    compose_cfg,
    final_params,
    logged_steps,
    read_records,
    slurm_cluster_node,
)

from horst_sparse.gpt2.run import run as gpt2_run
from horst_sparse.training.test_pacing import SECONDS_PER_STEP

if slurm_cluster_node() is None:
    pytest.skip(SLURM_CLUSTER_HINT, allow_module_level=True)
pytestmark = pytest.mark.slurm  # they wait on the scheduler for minutes: .ci/run runs them after `make test`

TINY_GPT2 = [
    "model=gpt2_nano",
    "device=cpu",
    "train.warmup_steps=1",
    "train.batch_size=2",
    "train.micro_batch_size=2",
    "train.log_interval=1",
    "train.eval_interval=0",
    "train.checkpoint_interval=0",
    "eval.max_windows=8",
    "prune.sparsities=[0.0,0.5]",
]
# What the presets ask for, cut to a CPU job that fits the test node (8 CPUs, 16 GB).
CPU_JOB = [
    "hydra/launcher=slurm_1gpu",
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=2",
    "hydra.launcher.timeout_min=20",
]
ENV = {**os.environ, **QUIET_ENV, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
TIMEOUT = 400


def sweep(
    sweep_dir: Path, *overrides: str, job: Sequence[str] = CPU_JOB, seconds_per_step: float = 0.0
) -> subprocess.Popen:
    """`python train_gpt2.py -m <job> <TINY_GPT2> overrides hydra.sweep.dir=...`, running. With
    `seconds_per_step`, every step of its cells takes at least that long (the test suite's pacing,
    horst_sparse/training/test_pacing.py): a cell that must still train when SLURM acts on it
    does, however fast the machine."""
    # The knob is refused without PYTEST_CURRENT_TEST, which pytest sets for each test (ENV was read
    # before any); sbatch exports the launcher's environment to the jobs, SLURM keeps it for a requeue.
    paced = {SECONDS_PER_STEP: str(seconds_per_step), "PYTEST_CURRENT_TEST": os.environ["PYTEST_CURRENT_TEST"]}
    command = [
        sys.executable,
        str(ROOT / "train_gpt2.py"),
        "-m",
        *job,
        *TINY_GPT2,
        *overrides,
        f"hydra.sweep.dir={sweep_dir}",
    ]
    env = {**ENV, **paced} if seconds_per_step else ENV
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, what: str, timeout: float = TIMEOUT, every: float = 0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := condition():
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def cells(sweep_dir: Path) -> list[dict]:
    path = sweep_dir / "jobs.json"
    return json.loads(path.read_text())["cells"] if path.exists() else []


def job_state(job_id: str) -> tuple[str, int]:
    """SLURM's state of the job and how often it was requeued (`scontrol show job`)."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    return fields["JobState"], int(fields["Restarts"])


def test_a_cell_slurm_cancels_is_a_failed_cell_and_the_others_finish(slurm_cluster, pydoc_dir, tmp_path):
    sweep_dir = tmp_path / "sweep"
    # Cell 1's 2000 steps of 0.1 s or more: it trains on until it is cancelled.
    launcher = sweep(sweep_dir, f"data.dir={pydoc_dir}", "train.max_steps=4,2000,4", seconds_per_step=0.1)
    cancelled = wait_for(lambda: len(cells(sweep_dir)) == 3 and cells(sweep_dir)[1], "the submission")
    wait_for(lambda: logged_steps(Path(cancelled["run_dir"])), "cell 1 to train")
    subprocess.run(["scancel", cancelled["slurm_job_id"]], check=True)  # SIGTERM to a running job
    _, stderr = launcher.communicate(timeout=TIMEOUT)

    assert launcher.returncode == 1, stderr[-3000:]
    run_dir = Path(cancelled["run_dir"])
    record = json.loads((run_dir / "failed.json").read_text())
    assert record["slurm_state"].startswith("CANCELLED") and record["slurm_job_id"] == cancelled["slurm_job_id"]
    assert record["config"]["train"]["max_steps"] == 2000 and record["pipeline"] == "gpt2"
    # The run's own record (it checkpointed and said it was cancelled), kept by the launcher.
    assert f"failed cell {run_dir}: cancelled: SLURM job {cancelled['slurm_job_id']} CANCELLED" in stderr
    assert "1 cell(s) of this multirun failed" in stderr and "Traceback" not in stderr
    # The run checkpointed on SLURM's SIGTERM before it ended: a rerun continues from there.
    (checkpoint,) = run_dir.glob("ckpt_*.pt")
    assert int(checkpoint.stem.split("_")[1]) == logged_steps(run_dir)[-1] < 2000
    finished = sorted(p.parent.name for p in sweep_dir.glob("*/summary.json"))
    assert finished == [Path(c["run_dir"]).name for c in cells(sweep_dir) if c is not cancelled and c["num"] != 1]
    script = next((sweep_dir / ".submitit").rglob("*_submission.sh")).read_text()
    assert "#SBATCH --array=0-2%3" in script  # the sweep is one job array (parallelism: min(64, cells))
    assert "#SBATCH --ntasks-per-node=1" in script and "--gpus-per-node" not in script  # a CPU job: one task


@pytest.fixture(params=["term", "user"])
def preempt_signal(request, slurm_cluster):
    """The cluster's preemption signal for one test (`slurm_cluster.sh preempt-signal`): SIGTERM
    alone (22.05's default), or the job's --signal (submitit's USR2) with it. Cluster-wide, so the
    tests that set it hold a lock: two of them never overlap; the others do not preempt."""
    with open(Path(tempfile.gettempdir()) / "horst-slurm-preempt-signal.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        script = ["bash", str(ROOT / "scripts" / "slurm_cluster.sh"), "preempt-signal"]
        subprocess.run([*script, request.param], check=True, capture_output=True)
        try:
            yield request.param
        finally:
            subprocess.run([*script, "term"], check=True, capture_output=True)


def test_preemption_requeues_and_ends_with_the_weights_of_an_uninterrupted_run(
    preempt_signal, pydoc_dir, tmp_path, monkeypatch
):
    """A job on `urgent` preempts the cell (both ask for the node's one `slot`). SLURM sends
    SIGTERM (submitit ignores it), or with preempt_send_user_signal USR2 and SIGTERM at once
    (submitit's `scontrol requeue` would fail: the cell would end failed); either way the run
    checkpoints at the next step and exits, SLURM requeues the job, and the run continues from
    that checkpoint."""
    # The preemption waits for the scheduler's next pass (sched_interval=10 s): the cell's 100 steps
    # of 0.4 s or more (>= 40 s) are still training when it lands. The reference run is not paced.
    steps, seconds_per_step = 100, 0.4
    overrides = [*TINY_GPT2, f"train.max_steps={steps}", f"data.dir={pydoc_dir}", "optimizer=horst"]
    reference = tmp_path / "reference"
    with monkeypatch.context() as patch:
        for key, value in QUIET_ENV.items():
            patch.setenv(key, value)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        gpt2_run(compose_cfg(overrides), run_dir=reference)
        torch.set_num_threads(threads)

    sweep_dir = tmp_path / "sweep"
    launcher = sweep(
        sweep_dir,
        f"data.dir={pydoc_dir}",
        f"train.max_steps={steps}",
        "optimizer=horst",
        "hydra.launcher.partition=preemptible",
        "hydra.launcher.gres=slot:1",
        seconds_per_step=seconds_per_step,
    )
    (cell,) = wait_for(lambda: cells(sweep_dir), "the submission")
    run_dir = Path(cell["run_dir"])
    wait_for(lambda: len(logged_steps(run_dir)) >= 3, "the cell to train")
    subprocess.run(
        ["sbatch", "-p", "urgent", "--gres=slot:1", "-o", "/dev/null", "--wrap", "sleep 1"],
        check=True,
        capture_output=True,
    )
    _, stderr = launcher.communicate(timeout=TIMEOUT)
    assert launcher.returncode == 0, stderr[-3000:]

    log = "".join(p.read_text() for p in (sweep_dir / ".submitit").rglob("*_log.*"))
    (stopped,) = [line.split("stopped by ", 1)[1].split(":")[0] for line in log.splitlines() if "stopped by " in line]
    assert sorted(stopped.split(" and ")) == {"term": ["SIGTERM"], "user": ["SIGTERM", "SIGUSR2"]}[preempt_signal]
    assert "resumed from" in log
    assert job_state(cell["slurm_job_id"])[1] >= 1  # requeued by SLURM (submitit's own requeue would fail)
    assert logged_steps(run_dir) == list(range(1, steps + 1))  # no step lost or repeated
    without_markers = lambda d: [r for r in read_records(d) if r.get("event") != "checkpoint"]  # noqa: E731
    assert without_markers(run_dir) == without_markers(reference)
    expected, actual = final_params(reference), final_params(run_dir)
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name


def test_a_two_task_ddp_cell_checkpoints_on_usr2_is_requeued_by_submitit_and_finishes(
    slurm_cluster, pydoc_dir, tmp_path
):
    """Two SLURM tasks train one model (DDP over gloo, rendezvous from SLURM's variables).
    SIGUSR2 reaches both (what SLURM sends `signal_delay_s` before the time limit; here
    `scancel --signal=USR2`): they checkpoint at the same step, submitit's handler requeues the
    job (`scontrol requeue`), and the requeued job continues with no step lost or repeated."""
    sweep_dir = tmp_path / "sweep"
    launcher = sweep(
        sweep_dir,
        f"data.dir={pydoc_dir}",
        "train.max_steps=60",
        "train.batch_size=4",
        "hydra.launcher.tasks_per_node=2",
        seconds_per_step=0.3,  # 60 steps, >= 18 s: still training when the signal comes
    )
    (cell,) = wait_for(lambda: cells(sweep_dir), "the submission")
    run_dir = Path(cell["run_dir"])
    wait_for(lambda: len(logged_steps(run_dir)) >= 3, "the cell to train")
    subprocess.run(["scancel", "--signal=USR2", cell["slurm_job_id"]], check=True)
    _, stderr = launcher.communicate(timeout=TIMEOUT)
    assert launcher.returncode == 0, stderr[-3000:]

    log = "".join(p.read_text() for p in (sweep_dir / ".submitit").rglob("*_log.*"))
    assert "Requeued job" in log and "resumed from" in log
    assert job_state(cell["slurm_job_id"])[1] == 1
    assert logged_steps(run_dir) == list(range(1, 61))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["train"]["world_size"] == 2 and summary["train"]["steps"] == 60


@pytest.mark.slow  # a 3-minute time limit, reached once or twice
def test_a_cell_past_its_time_limit_is_requeued_from_its_checkpoints_until_it_finishes(
    slurm_cluster, pydoc_dir, tmp_path
):
    """A 3-minute limit with SIGUSR2 60 s before it: each run of the job trains until the signal,
    checkpoints, and submitit requeues it as timed out. SLURM sends the signal up to 60 s
    early: a signal that lands while Python starts, before submitit's handler, kills the job
    (a failed cell, "User defined signal 2"), hence the margin. The signal comes 60 to 120 s
    after the job starts: the cell's 260 steps of 0.5 s or more (>= 130 s) outlast that."""
    steps = 260
    sweep_dir = tmp_path / "sweep"
    launcher = sweep(
        sweep_dir,
        f"data.dir={pydoc_dir}",
        f"train.max_steps={steps}",
        "hydra.launcher.timeout_min=3",
        "hydra.launcher.signal_delay_s=60",
        "hydra.launcher.max_num_timeout=8",
        seconds_per_step=0.5,
    )
    _, stderr = launcher.communicate(timeout=1500)
    assert launcher.returncode == 0, stderr[-3000:]
    (cell,) = cells(sweep_dir)
    log = "".join(p.read_text() for p in (sweep_dir / ".submitit").rglob("*_log.*"))
    assert "this job is timed-out" in log and "resumed from" in log
    assert job_state(cell["slurm_job_id"])[1] >= 1
    assert logged_steps(Path(cell["run_dir"])) == list(range(1, steps + 1))


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_late_requeue_of_a_finished_cell_changes_no_file(slurm_cluster, pydoc_dir, tmp_path):
    """What SLURM does to a job that finished within its grace period after SIGTERM: it runs it
    again. The second run finds its run folder finished and leaves every file as it was
    (Hydra's own `.hydra/*.yaml` are written again by each job, with the same content)."""
    sweep_dir = tmp_path / "sweep"
    launcher = sweep(sweep_dir, f"data.dir={pydoc_dir}", "train.max_steps=4")
    _, stderr = launcher.communicate(timeout=TIMEOUT)
    assert launcher.returncode == 0, stderr[-3000:]
    (cell,) = cells(sweep_dir)
    run_dir, job_id = Path(cell["run_dir"]), cell["slurm_job_id"]
    before = snapshot(run_dir)

    subprocess.run(["scontrol", "requeue", job_id], check=True)
    wait_for(lambda: job_state(job_id) == ("COMPLETED", 1), "the requeued job to end", every=1)
    log = "".join(p.read_text() for p in (sweep_dir / ".submitit").rglob("*_log.out"))
    assert "holds this run, finished (summary.json); nothing to do" in log
    after = snapshot(run_dir)
    hydra_files = {k for k in before if k.startswith(".hydra/")}
    assert {k: v[0] for k, v in after.items()} == {k: v[0] for k, v in before.items()}  # same files, same bytes
    assert {k: v for k, v in after.items() if k not in hydra_files} == {
        k: v for k, v in before.items() if k not in hydra_files
    }  # untouched


def test_submit_and_return_then_status_follows_the_cells(slurm_cluster, pydoc_dir, tmp_path):
    """`hydra.launcher.wait=false` returns once the jobs are queued; `horst-sparse status` (the
    command it names) shows each cell's state, records a cell SLURM ended as failed, and collects
    the tables."""
    sweep_dir = tmp_path / "sweep"
    # Steps of 2 s or more: the short cell (6 steps) is still running when the launcher has returned
    # and the first status is shown; the long one trains on until it is cancelled.
    launcher = sweep(
        sweep_dir, f"data.dir={pydoc_dir}", "train.max_steps=6,2000", "hydra.launcher.wait=false", seconds_per_step=2
    )
    _, stderr = launcher.communicate(timeout=TIMEOUT)
    assert launcher.returncode == 0, stderr[-3000:]
    assert f"their state: horst-sparse status {sweep_dir}" in stderr
    sweep_status = [HORST_SPARSE, "status"]  # installed beside this Python
    short, long = cells(sweep_dir)
    assert not list(sweep_dir.glob("*/summary.json"))  # returned before any cell finished

    def status() -> subprocess.CompletedProcess:
        return subprocess.run(
            [*sweep_status, str(sweep_dir)],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=120,
        )

    first = status()
    assert first.returncode == 3, first.stderr  # some cells pending or running
    assert all(line.split()[1] in ("pending", "running") for line in first.stdout.splitlines()[:2]), first.stdout
    wait_for(lambda: logged_steps(Path(long["run_dir"])), "the long cell to train")
    subprocess.run(["scancel", long["slurm_job_id"]], check=True)
    wait_for(lambda: status().returncode != 3, "every cell to end", every=2)

    final = status()
    shown = final.stdout.splitlines()
    rows = {line.split()[0]: line for line in shown[:-1] if not line.startswith(" ")}  # indented: notes
    assert final.returncode == 1, final.stdout
    assert rows[Path(short["run_dir"]).name].split()[1] == "done"
    assert f"failed   cancelled: SLURM job {long['slurm_job_id']} CANCELLED" in rows[Path(long["run_dir"]).name]
    record = json.loads((Path(long["run_dir"]) / "failed.json").read_text())
    assert record["slurm_state"].startswith("CANCELLED") and record["config"]["train"]["max_steps"] == 2000
    assert "1 done, 1 failed, 0 running, 0 pending of 2 cells" in final.stdout
    # Below the failed row: its last checkpoint (SIGTERM's) and the line that continues the cell
    # alone, on this machine, as its failed.json names them.
    notes = shown[shown.index(rows[Path(long["run_dir"]).name]) + 1 :][:2]
    checkpoint = record.get("checkpoint")
    assert notes[0] == (
        f"    last checkpoint: {checkpoint} (step {record['checkpoint_step']})"
        if checkpoint
        else "    last checkpoint: none (the run starts again from its first step)"
    )
    assert notes[1] == f"    continue this cell alone, on this machine: {record['continue']}"
    assert record["continue"].startswith("python train_gpt2.py ")

    tables = subprocess.run(
        [*sweep_status, str(sweep_dir), "--tables", str(tmp_path / "tables")],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tables.returncode == 1, tables.stderr[-2000:]
    assert list((tmp_path / "tables").iterdir()), tables.stdout


def test_the_cpu_preset_runs_its_cells_and_each_is_printed_as_it_ends(slurm_cluster, pydoc_dir, tmp_path):
    """`hydra/launcher=slurm_cpu` as it is (one task, its CPUs and memory, no GPU) runs on an
    8-CPU node; waiting (`wait=true`), the launcher prints each cell as it ends: the short second
    cell first, while the long first one trains on."""
    sweep_dir = tmp_path / "sweep"
    # The long cell's 60 steps of 0.5 s or more (>= 30 s) outlast the short one's 4 and both start-ups.
    launcher = sweep(
        sweep_dir,
        f"data.dir={pydoc_dir}",
        "train.max_steps=60,4",
        job=["hydra/launcher=slurm_cpu"],
        seconds_per_step=0.5,
    )
    _, stderr = launcher.communicate(timeout=TIMEOUT)
    assert launcher.returncode == 0, stderr[-3000:]
    long, short = cells(sweep_dir)
    assert [line for line in stderr.splitlines() if line.startswith("cell #")] == [
        f"cell #1 ended done (1 of 2 ended): {short['run_dir']}",
        f"cell #0 ended done (2 of 2 ended): {long['run_dir']}",
    ]
    preset = yaml.safe_load((ROOT / "configs" / "hydra" / "launcher" / "slurm_cpu.yaml").read_text())
    script = next((sweep_dir / ".submitit").rglob("*_submission.sh")).read_text()
    for line in ("--ntasks-per-node=1", f"--cpus-per-task={preset['cpus_per_task']}", f"--mem={preset['mem_gb']}GB"):
        assert f"#SBATCH {line}\n" in script, line
    assert "--gpus-per-node" not in script


def test_a_cpu_job_of_the_gpu_preset_is_planned_with_a_warning_and_shown_pending_with_slurms_reason(
    slurm_cluster, pydoc_dir, tmp_path
):
    """The 4-GPU preset with `gpus_per_node=0`: one task of 12 CPUs, more than the test node's 8.
    `horst-sparse plan` says what each task asks and warns in one line naming the key to lower;
    submitted anyway, SLURM queues the job and never starts it, and `horst-sparse status` shows
    why (squeue's PartitionConfig) and what to do. (Its 256 GB sbatch refuses outright here.)"""
    job = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "hydra.launcher.mem_gb=2"]
    arguments = [*job, *TINY_GPT2, f"data.dir={pydoc_dir}", "train.max_steps=4"]
    planned = subprocess.run(
        [HORST_SPARSE, "plan", "train_gpt2.py", "-m", *arguments],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert planned.returncode == 0 and "Traceback" not in planned.stderr, planned.stderr[-3000:]
    assert "x 0 GPU(s), 1 task(s) per node" in planned.stdout
    assert "per task: 12 CPU(s), 2 GB; per node (1 task(s)): 12 CPU(s), 2 GB" in planned.stdout
    (warning,) = [line for line in planned.stdout.splitlines() if "warning:" in line]
    assert "more than any node of partition debug (the default) has (8 CPUs and 15.6 GB; sinfo)" in warning
    assert warning.endswith("lower hydra.launcher.cpus_per_task (or use hydra/launcher=slurm_cpu)")

    sweep_dir = tmp_path / "sweep"
    launcher = sweep(sweep_dir, f"data.dir={pydoc_dir}", "train.max_steps=4", "hydra.launcher.wait=false", job=job)
    _, stderr = launcher.communicate(timeout=TIMEOUT)
    assert launcher.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    (cell,) = cells(sweep_dir)
    job_id = cell["slurm_job_id"]
    try:

        def pending_for_its_partition() -> list[str] | None:
            shown = subprocess.run(
                [HORST_SPARSE, "status", str(sweep_dir)],
                env=ENV,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert shown.returncode == 3, shown.stderr[-3000:]
            lines = shown.stdout.splitlines()
            return lines if lines[0].endswith(f"pending  SLURM job {job_id} PENDING (PartitionConfig)") else None

        lines = wait_for(pending_for_its_partition, "SLURM's reason for the pending job", timeout=60, every=1)
        assert lines[1].startswith(
            f"    it will not start: it asks more than the partition's nodes have or allow; `scancel {job_id}`"
        )
        assert lines[2] == "0 done, 0 failed, 0 running, 1 pending of 1 cells"
    finally:
        subprocess.run(["scancel", job_id], check=True)


def test_a_cancelled_cell_of_a_sweep_that_returned_is_continued_by_the_line_status_prints(slurm_cluster, tmp_path):
    """A `wait=false` sweep of the ViT smoke preset on `slurm_cpu`, W&B offline as a user runs it;
    `scancel` of one cell while it trains. That cell checkpoints, says in its log that it was
    cancelled (no traceback: W&B's service process, which SLURM's SIGTERM ends too, is closed
    cleanly) and records it. `horst-sparse status` prints the line that continues the sweep; run as
    printed, it submits the cancelled cell alone, through the same launcher, and that cell
    continues from its checkpoint while the finished one keeps its files."""
    sweep_dir = tmp_path / "sweep"
    cells_given = ["experiment=smoke_vit", "optimizer=horst", "optimizer.alpha=10,100"]
    command = [
        sys.executable,
        str(ROOT / "train_vit.py"),
        "-m",
        "hydra/launcher=slurm_cpu",
        "hydra.launcher.wait=false",
    ]
    # Steps of 0.5 s or more: the cell (64 steps) is still training when it is cancelled. The sweep as
    # continued is not paced. W&B offline: its service process is one that SLURM signals.
    env = {**ENV, "WANDB_MODE": "offline", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    paced = {**env, SECONDS_PER_STEP: "0.5", "PYTEST_CURRENT_TEST": os.environ["PYTEST_CURRENT_TEST"]}
    submitted = subprocess.run(
        [*command, *cells_given, f"hydra.sweep.dir={sweep_dir}"],
        cwd=ROOT,
        env=paced,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    finished, cancelled = cells(sweep_dir)
    wait_for(lambda: logged_steps(Path(cancelled["run_dir"])), "cell 1 to train")
    subprocess.run(["scancel", cancelled["slurm_job_id"]], check=True)
    sweep_status = [HORST_SPARSE, "status"]

    def status() -> subprocess.CompletedProcess:
        return subprocess.run([*sweep_status, str(sweep_dir)], env=env, capture_output=True, text=True, timeout=120)

    wait_for(lambda: status().returncode != 3, "both cells to end", every=2)
    shown = status()
    assert shown.returncode == 1, shown.stdout + shown.stderr
    run_dir = Path(cancelled["run_dir"])
    record = json.loads((run_dir / "failed.json").read_text())
    job = cancelled["slurm_job_id"]
    assert record["reason"].startswith(f"cancelled: SLURM job {job} CANCELLED") and record["slurm_job_id"] == job
    (err,) = sweep_dir.glob(f".submitit/{job}/*_log.err")
    log = err.read_text()
    assert "Traceback" not in log and f"cancelled: SLURM job {job} CANCELLED" in log, log[-3000:]
    assert "Job completed successfully" not in (err.with_suffix(".out")).read_text()
    row = next(line for line in shown.stdout.splitlines() if line.startswith(run_dir.name))
    assert row.split(None, 2)[1:] == ["failed", record["reason"]]
    line = shown.stdout.split("continue the sweep (its finished cells are kept) with: ", 1)[1].splitlines()[0]
    assert line.startswith("python train_vit.py -m hydra/launcher=slurm_cpu hydra.launcher.wait=false ")

    before = snapshot(Path(finished["run_dir"]))
    continued = subprocess.run(shlex.split(line), cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert continued.returncode == 0, continued.stderr[-3000:]
    assert "submitted 1 cell(s) as SLURM job " in continued.stderr
    assert "(1 finished cell(s) left as they are)" in continued.stderr
    again_finished, again_cancelled = cells(sweep_dir)
    assert again_finished["slurm_job_id"] == finished["slurm_job_id"]  # no job for the finished cell
    assert again_cancelled["slurm_job_id"] != job
    wait_for(lambda: status().returncode != 3, "the continued cell to end", every=2)
    final = status()
    assert final.returncode == 0 and "2 done, 0 failed, 0 running, 0 pending of 2 cells" in final.stdout, final.stdout
    assert "continue the sweep" not in final.stdout
    (out,) = sweep_dir.glob(f".submitit/{again_cancelled['slurm_job_id']}/*_log.out")
    assert f"resumed from {record['checkpoint']} " in out.read_text()
    assert logged_steps(run_dir) == list(range(5, 61, 5))  # each logged step once (every 5th of 64)
    assert not (run_dir / "failed.json").exists() and (run_dir / "summary.json").is_file()
    assert snapshot(Path(finished["run_dir"])) == before
