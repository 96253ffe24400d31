"""A stand-in for SLURM's commands, for what the one-node test cluster (scripts/slurm_cluster.sh,
tests/test_slurm_cluster.py) cannot show: jobs that ask for GPUs (the node has none, and real
sbatch refuses them) and, with them, the presets as users submit them on a GPU cluster.
Submitit's real SLURM executor runs its real sbatch scripts through it (tests/test_launchers.py
puts links to this file named sbatch, srun, sacct, squeue and scontrol on PATH; it acts as the
one it is called as). Scheduling, signals, preemption, requeues and accounting are tested
against real SLURM, not here.

* `sbatch SCRIPT`: keeps a copy of the script (`<state>/<job>.sbatch`), prints
  "Submitted batch job <job>" and runs each array task of it in the background with the
  environment SLURM gives a task (job and array ids, SLURM_NTASKS from --ntasks-per-node,
  the node list, SLURM_RESTART_COUNT). A task requeued by `scontrol requeue` runs again
  when its process has exited, as SLURM does.
* `srun`: starts SLURM_NTASKS copies of its command (SLURM_PROCID/SLURM_LOCALID set), with
  --output/--error and their %A/%a/%j/%t patterns; records each process id in
  `<state>/<task>.<rank>.pid` for the test to signal.
* `sacct -o JobID,State,NodeList --parsable2 -j JOB`, `squeue`: the tasks' states.
* `scontrol requeue TASK`: marks the task for another run.

The state folder is $FAKE_SLURM_STATE. Nothing is scheduled: every task starts at once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("FAKE_SLURM_STATE", "/tmp/fake_slurm"))


def _sbatch_options(script: str) -> dict[str, str]:
    options = {}
    for line in script.splitlines():
        if m := re.match(r"#SBATCH --([\w-]+)(?:=(.*))?$", line.strip()):
            options[m.group(1)] = m.group(2) or ""
    return options


def sbatch(args: list[str]) -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    script_path = Path(args[-1])
    script = script_path.read_text()
    counter = STATE / "next_job_id"
    job = int(counter.read_text()) if counter.exists() else 1000
    counter.write_text(str(job + 1))
    (STATE / f"{job}.sbatch").write_text(script)
    options = _sbatch_options(script)
    indices = [None]
    if "array" in options:
        first, last = options["array"].split("%")[0].split("-")
        indices = list(range(int(first), int(last) + 1))
    for index in indices:
        task = f"{job}_{index}" if index is not None else str(job)
        (STATE / f"{task}.state").write_text("PENDING")
        subprocess.Popen(
            [sys.executable, __file__, "_run_task", str(job), "" if index is None else str(index), str(script_path)],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    print(f"Submitted batch job {job}")
    return 0


def _run_task(job: str, index: str, script_path: str) -> int:
    script = Path(script_path).read_text()
    options = _sbatch_options(script)
    task = f"{job}_{index}" if index else job
    ntasks = int(options.get("ntasks-per-node", "1")) * int(options.get("nodes", "1"))
    env = {
        **os.environ,
        # an array task has an id of its own besides (array job, index); a plain job is its id
        "SLURM_JOB_ID": str(int(job) * 1000 + int(index)) if index else job,
        "SLURM_NTASKS": str(ntasks),
        "SLURM_JOB_NUM_NODES": options.get("nodes", "1"),
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "localhost",
        "FAKE_SLURM_TASK": task,
    }
    if index:
        env.update(SLURM_ARRAY_JOB_ID=job, SLURM_ARRAY_TASK_ID=index)
    restarts = 0
    while True:
        env["SLURM_RESTART_COUNT"] = str(restarts)
        (STATE / f"{task}.state").write_text("RUNNING")
        code = subprocess.call(["bash", script_path], env=env)
        flag = STATE / f"{task}.requeue"
        if flag.exists():
            flag.unlink()
            restarts += 1
            (STATE / f"{task}.restarts").write_text(str(restarts))
            continue
        (STATE / f"{task}.state").write_text("COMPLETED" if code == 0 else "FAILED")
        return code


def _expand(pattern: str, rank: int) -> str:
    job, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    pattern = pattern.replace("%A", job or os.environ["SLURM_JOB_ID"]).replace("%a", index or "0")
    return pattern.replace("%j", os.environ["SLURM_JOB_ID"]).replace("%t", str(rank))


def srun(args: list[str]) -> int:
    output = error = None
    while args and args[0].startswith("--"):
        option = args.pop(0)
        if option in ("--output", "--error"):
            value = args.pop(0)
            output, error = (value, error) if option == "--output" else (output, value)
    processes = []
    for rank in range(int(os.environ.get("SLURM_NTASKS", "1"))):
        env = {**os.environ, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)}
        out = open(_expand(output, rank), "a") if output else None
        err = open(_expand(error, rank), "a") if error else None
        process = subprocess.Popen(args, env=env, stdout=out, stderr=err)
        (STATE / f"{os.environ['FAKE_SLURM_TASK']}.{rank}.pid").write_text(str(process.pid))
        processes.append(process)
    return max(abs(p.wait()) for p in processes)


def sacct(args: list[str]) -> int:
    jobs = [args[i + 1] for i, a in enumerate(args) if a == "-j"]
    print("JobID|State|NodeList")
    for path in sorted(STATE.glob("*.state")):
        task = path.name.removesuffix(".state")
        if not jobs or task.split("_")[0] in jobs:
            print(f"{task}|{path.read_text()}|localhost")
    return 0


def squeue(args: list[str]) -> int:
    print("JOBID STATE")
    for path in sorted(STATE.glob("*.state")):
        if path.read_text() in ("PENDING", "RUNNING"):
            print(f"{path.name.removesuffix('.state')} {path.read_text()}")
    return 0


def scontrol(args: list[str]) -> int:
    if args[:1] != ["requeue"]:
        print(f"fake scontrol: unsupported {args}", file=sys.stderr)
        return 1
    (STATE / f"{args[1]}.requeue").write_text(str(time.time()))
    return 0


if __name__ == "__main__":
    command, arguments = Path(sys.argv[0]).name, sys.argv[1:]
    if command == "fake_slurm.py":
        command, arguments = arguments[0], arguments[1:]
    if command == "_run_task":
        sys.exit(_run_task(*arguments))
    sys.exit(
        {"sbatch": sbatch, "srun": srun, "sacct": sacct, "squeue": squeue, "scontrol": scontrol}[command](arguments)
    )
