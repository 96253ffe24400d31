"""`horst-sparse status`: each cell of a SLURM sweep: done, failed (and why), running or pending;
the finished ones into tables. SLURM's states, mapped beside the launcher that submits the jobs.

    python train_vit.py -m +study=deit_table hydra/launcher=slurm hydra.launcher.wait=false ...
    horst-sparse status multirun/2026-12-01/10-00-00
    horst-sparse status multirun/2026-12-01/10-00-00 --tables results/deit   # and horst-sparse tables

It reads `<sweep>/jobs.json` (each cell's SLURM job and run folder, written by the SLURM
launcher when it submits; hydra_plugins/horst_slurm), the run folders (`summary.json`: done;
the `failed.json` of the cell's job: failed, with its reason, and below it the last checkpoint
and the line that continues that cell alone, on this machine, where the record names them) and,
for the other cells (a record of an earlier try of a cell submitted again among them), SLURM's state through
submitit (one `sacct` call) and a pending job's reason (one `squeue` call: Resources, Priority,
or PartitionConfig, a job that asks more than the partition's nodes have and never starts). A
cell that SLURM ended (cancelled, out of memory, node failure, time-out) gets its `failed.json`
here, as the launcher writes it when it waits, so that the tables list it among the failed runs.

Once no cell is pending or running and some failed, it prints the line that continues the whole
sweep: the command it was submitted with (`jobs.json`, else Hydra's `multirun.yaml`) in its
folder, through the same launcher; its finished cells get no job, the others continue from
their checkpoints.

Exit status: 3 while some cells are pending or running, else 1 if any failed, else 0.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from horst_sparse.training.run_log import FAILED_FILE, METRICS_FILE, SUMMARY_FILE
from hydra_plugins.horst_slurm.slurm_launcher import JOBS_FILE, job_record

# SLURM states of a job that will still run (PREEMPTED: on its way back to the queue when requeued).
QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING", "PREEMPTED", "UNKNOWN"}
RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "RESIZING"}
UNFINISHED_EXIT_CODE = 3
# Pending reasons that waiting does not end: the job asks more CPUs, memory, nodes or time than
# the partition gives (SLURM's default EnforcePartLimits=NO queues such a job all the same).
NEVER_STARTS = {"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit"}


def last_step(run_dir: Path) -> int | None:
    """The step of the run log's last record (`metrics.jsonl`), if any."""
    path = run_dir / METRICS_FILE
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1]).get("step") if lines else None


def pending_reasons(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """SLURM's state of each of these queued jobs and why it has not started (`squeue -h -r -o
    "%i %T %r"`: PENDING and Resources, Priority, BeginTime, PartitionConfig, ...), by job id
    (array tasks as `123_4`, which sacct lists only once they start); a job squeue no longer
    lists, or no squeue at all, is left out."""
    if not job_ids:
        return {}
    command = ["squeue", "-h", "-r", "-o", "%i %T %r", "-j", ",".join(job_ids)]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {f[0]: (f[1], f[2]) for line in out.splitlines() if len(f := line.split(None, 2)) == 3}


def resume_notes(record: dict[str, Any]) -> list[str]:
    """A failed cell's last checkpoint (path and step) and the line that continues it, as its
    `failed.json` names them: `last_checkpoint` ({path, step}, or a path) or `checkpoint` and
    `checkpoint_step`, and `continue`; records written before those fields give nothing."""
    last = record.get("last_checkpoint")
    if isinstance(last, dict):
        path, step = last.get("path"), last.get("step")
    elif isinstance(last, (list, tuple)) and len(last) == 2:
        path, step = last
    elif isinstance(last, str):
        path, step = last, None
    else:
        path, step = record.get("checkpoint"), record.get("checkpoint_step")
    notes = []
    if path:
        notes.append(f"last checkpoint: {path}" + (f" (step {step})" if step is not None else ""))
    elif "last_checkpoint" in record or "checkpoint" in record:  # named, and null: nothing to continue from
        notes.append("last checkpoint: none (the run starts again from its first step)")
    command = record.get("continue")
    if isinstance(command, (list, tuple)):
        command = shlex.join(map(str, command))
    if command:  # the sweep's line goes through SLURM (`continue_sweep`); this one runs here
        notes.append(f"continue this cell alone, on this machine: {command}")
    return notes


def cell_states(sweep_dir: Path) -> list[dict]:
    """One row per cell: `num`, `state` (done | failed | running | pending), `detail`, `run_dir`,
    `notes` (lines printed below the row: a failed cell's checkpoint and the line that continues
    it, a pending job that will not start)."""
    import submitit

    manifest = json.loads((sweep_dir / JOBS_FILE).read_text())
    cells = manifest["cells"]
    jobs = {
        c["slurm_job_id"]: submitit.SlurmJob(folder=manifest["submitit_folder"], job_id=c["slurm_job_id"])
        for c in cells
        if c["slurm_job_id"]  # None: finished before the submission that listed it
    }
    rows, ended = [], {}
    for cell in cells:
        run_dir, job_id = Path(cell["run_dir"]), cell["slurm_job_id"]
        notes: list[str] = []
        if (run_dir / SUMMARY_FILE).exists():
            state, detail = "done", ""
        elif record := job_record(run_dir, job_id):
            state, detail = "failed", str(record.get("reason", f"(no reason in its {FAILED_FILE})"))
            notes = resume_notes(record)
        elif job_id is None:
            state, detail = "failed", f"no job and no {SUMMARY_FILE}: continuing the sweep submits it"
        else:
            slurm_state = jobs[job_id].state  # e.g. "RUNNING", "CANCELLED by 0", "OUT_OF_MEMORY"
            name = slurm_state.split()[0]
            if name in QUEUED:
                state, detail = "pending", f"SLURM job {job_id} {slurm_state}"
            elif name in RUNNING:
                step = last_step(run_dir)
                state, detail = (
                    "running",
                    f"SLURM job {job_id}" + (f", at step {step}" if step is not None else ", starting"),
                )
            else:  # ended, as far as sacct says: SLURM ended it, or it died outside Python's reach
                state, detail = "ended", slurm_state
                ended[job_id] = cell
        rows.append({"num": cell["num"], "state": state, "detail": detail, "run_dir": str(run_dir), "notes": notes})
    # One squeue call: why the pending jobs wait (sacct does not say), and which ended ones are still
    # ending. sacct says CANCELLED from the scancel on, while the run checkpoints and records why it
    # stopped (squeue: COMPLETING); a record written before it is done would be overwritten by its own.
    by_job = {cell["slurm_job_id"]: row for cell, row in zip(cells, rows) if row["state"] in ("pending", "ended")}
    listed = pending_reasons(list(by_job))
    for job_id, row in by_job.items():
        if row["state"] == "ended" and job_id in listed:
            row["state"], row["detail"] = "running", f"SLURM job {job_id} {row['detail']}, ending ({listed[job_id][0]})"
        elif row["state"] == "ended":
            run_dir, slurm_state = Path(row["run_dir"]), row["detail"]
            if not (record := job_record(run_dir, job_id)):  # the run ended without recording why
                from horst_sparse.training.runner import record_failed_cell  # torch and all: only when needed

                cell = ended[job_id]
                record = record_failed_cell(
                    run_dir,
                    pipeline=manifest["pipeline"],
                    reason=f"SLURM job {job_id} ended {slurm_state} without a summary",
                    exit_code=None,
                    step=None,
                    config=cell["config"],
                    overrides=cell.get("overrides"),  # for the line that continues it
                    slurm_job_id=job_id,
                    slurm_state=slurm_state,
                )
            row["state"], row["detail"] = "failed", str(record.get("reason", f"(no reason in its {FAILED_FILE})"))
            row["notes"] = resume_notes(record)
        elif job_id in listed:
            slurm_state, reason = listed[job_id]
            row["detail"] = f"SLURM job {job_id} {slurm_state} ({reason})"
            if reason in NEVER_STARTS:
                row["notes"].append(
                    f"it will not start: it asks more than the partition's nodes have or allow; `scancel {job_id}` "
                    "and submit it again with less (horst-sparse plan prints what each job asks)"
                )
    return rows


def continue_sweep(sweep_dir: Path) -> str | None:
    """The line that continues the sweep in `sweep_dir`: what the launcher recorded in
    `jobs.json`, else (a sweep submitted before it did) the one Hydra's `multirun.yaml` gives,
    in this folder; None without either."""
    recorded = json.loads((sweep_dir / JOBS_FILE).read_text()).get("command")
    if recorded or not (sweep_dir / "multirun.yaml").is_file():
        return recorded
    from omegaconf import OmegaConf, open_dict

    from horst_sparse.training.runner import sweep_command

    config = OmegaConf.load(sweep_dir / "multirun.yaml")
    with open_dict(config):  # saved unresolved: a `${now:...}` folder would be resolved anew
        config.hydra.sweep.dir = str(sweep_dir)
    return sweep_command(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="horst-sparse status", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="the multirun's folder (hydra.sweep.dir), holding jobs.json")
    parser.add_argument(
        "--tables",
        type=Path,
        metavar="OUT",
        help="then write the tables of the finished cells into OUT (horst-sparse tables)",
    )
    args = parser.parse_args(argv)
    if not (args.sweep_dir / JOBS_FILE).is_file():
        parser.exit(
            2,
            f"error: {args.sweep_dir / JOBS_FILE} not found: give the folder of a sweep submitted with "
            "hydra/launcher=slurm, slurm_1gpu or slurm_cpu (hydra.sweep.dir)\n",
        )
    rows = cell_states(args.sweep_dir)
    width = max(len(Path(r["run_dir"]).name) for r in rows)
    for row in rows:
        print(f"{Path(row['run_dir']).name:<{width}}  {row['state']:<7}  {row['detail']}".rstrip())
        for note in row["notes"]:
            print(f"    {note}")
    counts = {s: sum(r["state"] == s for r in rows) for s in ("done", "failed", "running", "pending")}
    print(", ".join(f"{n} {s}" for s, n in counts.items()) + f" of {len(rows)} cells")
    if counts["failed"] and (counts["running"] or counts["pending"]):
        # Submitted now, a running cell would get a second job, refused its locked run folder.
        print("the line that continues the sweep comes here once no cell is pending or running")
    elif counts["failed"] and (line := continue_sweep(args.sweep_dir)):
        print(f"continue the sweep (its finished cells are kept) with: {line}")
    if args.tables:
        from horst_sparse.analysis.report import tables_main

        try:  # the tables' own error is one line; the exit code stays the cells' state
            tables_main([str(args.sweep_dir), "--out", str(args.tables)])
        except SystemExit as error:
            if error.code not in (None, 0):
                print(error.code, file=sys.stderr)
    elif counts["done"]:
        print(f"tables of the finished cells: horst-sparse tables {args.sweep_dir} --out OUT")
    if counts["running"] or counts["pending"]:
        return UNFINISHED_EXIT_CODE
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
