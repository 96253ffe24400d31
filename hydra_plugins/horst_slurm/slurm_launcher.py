"""hydra-submitit-launcher's SLURM launcher, made to survive what SLURM does to jobs.

* A cell that SLURM ends (`scancel`, out of memory, node failure, a hard time-out: submitit's
  `UncompletedJobError`) is a failed cell like one that fails in Python: its `failed.json`
  holds SLURM's state, the other cells go on and are collected, `RunCallbacks` lists it at
  the end and the multirun exits 1. (hydra-submitit-launcher's `launch` raises on the first
  such job, leaving the others running and recording nothing.)
* `wait: false` submits and returns once the jobs are queued.
* `<sweep dir>/jobs.json` names each cell's SLURM job and run folder, and the command line
  that continues the sweep, for `horst-sparse status` (each cell's state; collects the finished
  ones; prints that line); a sweep submitted again into its folder updates its cells there
  (`write_jobs_file`).
* A sweep submitted again (that line) submits no job for a cell whose run folder holds it,
  finished with the same settings (`finished_summary`): on a cluster each job may wait in the
  queue for hours only to find nothing to do. A failed or cancelled cell continues from its
  checkpoint. In a job, a stop signal prints that line too (`runner._sweep_command`).
* One task per GPU (`tasks_per_node: ${.gpus_per_node}` in the presets); a CPU job
  (`gpus_per_node=0`) is one task and asks for no GPU.
"""

# No `from __future__ import annotations`: Hydra scans this module outside sys.modules, where a
# dataclass cannot look string annotations up.

import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, filter_overrides

from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher

log = logging.getLogger(__name__)

JOBS_FILE = "jobs.json"


def write_jobs_file(
    sweep_dir: Path, *, pipeline: str, submitit_folder: str, cells: Sequence[dict], command: str | None = None
) -> None:
    """Record `cells` (each with its `run_dir`) in `<sweep_dir>/jobs.json`, after those already
    there: a sweeper's earlier batches stay, and a cell already listed (the same run folder:
    the sweep submitted again to continue it) takes its new job in its place, once. `command`:
    the line that continues the sweep (`horst_sparse.training.runner.sweep_command`)."""
    path = sweep_dir / JOBS_FILE
    listed = {c["run_dir"]: c for c in json.loads(path.read_text())["cells"]} if path.exists() else {}
    listed.update({c["run_dir"]: c for c in cells})  # a dict keeps the first listing's place
    manifest = {"pipeline": pipeline, "submitit_folder": submitit_folder, "command": command}
    path.write_text(json.dumps({**manifest, "cells": list(listed.values())}, indent=1))


def job_record(run_dir: Path, job_id: str | None) -> dict | None:
    """The cell's `failed.json` if it is this job's (it names this SLURM job, or no job: written
    before records named theirs), else None: a record of an earlier try of a cell the sweep
    submitted again says nothing of the job now. A record that cannot be read counts as this
    job's, with that as its reason."""
    from horst_sparse.training.run_log import FAILED_FILE

    path = run_dir / FAILED_FILE
    if not path.is_file():
        return None
    try:  # written by other code, at other versions: read what is there
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict):
        return {"reason": f"(no reason readable in its {FAILED_FILE})"}
    return record if record.get("slurm_job_id") in (None, job_id) else None


@dataclass
class HorstSlurmQueueConf(SlurmQueueConf):
    _target_: str = "hydra_plugins.horst_slurm.slurm_launcher.SlurmLauncher"
    # false: return once the jobs are queued (`horst-sparse status <sweep dir>` follows them)
    wait: bool = True


ConfigStore.instance().store(group="hydra/launcher", name="horst_slurm", node=HorstSlurmQueueConf, provider="horst")


class SlurmLauncher(SubmititSlurmLauncher):
    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.wait = self.params.pop("wait", True)
        if not self.params.get("gpus_per_node"):  # a CPU job: one task, no GPU request
            self.params["gpus_per_node"] = None
            self.params["tasks_per_node"] = max(self.params["tasks_per_node"], 1)

    def _cell(self, overrides: Sequence[str], index: int) -> tuple[Path, dict]:
        """Cell `index`'s run folder and resolved config, as its job's `run_job` will make them."""
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf, open_dict, read_write

        config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.job.num = index
        hydra = HydraConfig.instance()
        outer = hydra.cfg
        hydra.set_config(config)  # the folder and the task's settings may interpolate `${hydra:...}`
        try:
            run_dir = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
            with read_write(config.hydra), open_dict(config.hydra):
                config.hydra.runtime.output_dir = str(run_dir)
            hydra.set_config(config)
            task = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
            return run_dir, OmegaConf.to_container(task, resolve=True)
        finally:
            hydra.cfg = outer

    def executor(self) -> Any:
        """submitit's SLURM executor with the launcher's parameters, as hydra-submitit-launcher's
        `launch` makes it."""
        import submitit
        from omegaconf import OmegaConf

        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

        params = dict(self.params)
        executor = submitit.AutoExecutor(
            cluster="slurm", folder=params.pop("submitit_folder"), slurm_max_num_timeout=params.pop("max_num_timeout")
        )
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
        return executor

    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
        """A cell in its SLURM job: a stop signal's line continues the whole sweep through SLURM."""
        from horst_sparse.training import runner

        runner._sweep_command = getattr(self, "sweep_line", None)
        return super().__call__(*args, **kwargs)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra.core.singleton import Singleton

        from horst_sparse.training.runner import finished_summary, sweep_command

        folder, executor = self.params["submitit_folder"], self.executor()
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        self.sweep_line = sweep_command(self.config)  # before map_array pickles the launcher for the jobs

        indices = [initial_job_idx + i for i in range(len(job_overrides))]
        for index, overrides in zip(indices, job_overrides):
            log.info(f"\t#{index} : {' '.join(filter_overrides(overrides))}")
        cells = [self._cell(o, i) for i, o in zip(indices, job_overrides)]
        finished = {k: done for k, (run_dir, config) in enumerate(cells) if (done := finished_summary(run_dir, config))}
        todo = [k for k in range(len(cells)) if k not in finished]
        arguments = [
            (list(job_overrides[k]), "hydra.sweep.dir", indices[k], f"job_id_for_{indices[k]}", Singleton.get_state())
            for k in todo
        ]
        jobs = dict(zip(todo, executor.map_array(self, *zip(*arguments)))) if todo else {}
        listed = (
            {c["run_dir"] for c in json.loads((sweep_dir / JOBS_FILE).read_text())["cells"]}
            if (sweep_dir / JOBS_FILE).exists()
            else set()
        )
        write_jobs_file(
            sweep_dir,
            pipeline=self.config.pipeline,
            submitit_folder=folder,
            command=self.sweep_line,
            cells=[
                {
                    "num": indices[k],
                    "slurm_job_id": jobs[k].job_id if k in jobs else None,  # None: finished before this sweep
                    "run_dir": str(run_dir),
                    "overrides": list(job_overrides[k]),
                    "config": config,
                }
                for k, (run_dir, config) in enumerate(cells)
                if k in jobs or str(run_dir) not in listed  # a finished cell keeps the job that finished it
            ],
        )
        kept = f" ({len(finished)} finished cell(s) left as they are)" if finished else ""
        if jobs:
            first = next(iter(jobs.values())).job_id.split("_")[0]
            print(
                f"submitted {len(jobs)} cell(s) as SLURM job {first}{kept}; their state: horst-sparse status {sweep_dir}",
                file=sys.stderr,
            )
        else:
            print(
                f"all {len(cells)} cell(s) are finished; nothing submitted: horst-sparse status {sweep_dir}",
                file=sys.stderr,
            )
        returns = {k: self._job_return(job_overrides[k], summary) for k, summary in finished.items()}
        if not self.wait:
            returns |= {
                k: self._job_return(job_overrides[k], {"status": "submitted", "slurm_job_id": job.job_id})
                for k, job in jobs.items()
            }
        elif jobs:
            ended = self._wait_each_as_it_ends(
                [indices[k] for k in todo],
                list(jobs.values()),
                [job_overrides[k] for k in todo],
                [cells[k] for k in todo],
            )
            returns |= dict(zip(todo, ended))
        return [returns[k] for k in range(len(cells))]

    def _wait_each_as_it_ends(
        self, indices: Sequence[int], jobs: Sequence[Any], job_overrides: Sequence[Sequence[str]], cells: Sequence
    ) -> list[JobReturn]:
        """`_wait` for every job, taking each as it ends (not in submission order, where the
        first long cell would hide the others), with one line per cell: a sweep that waits for
        hours says what has ended. `job.done()` reads the result file, else submitit's shared
        `sacct` poll (one call for all the jobs, rarer as they age), as `job.results()` does."""
        import time

        from horst_sparse.training.run_log import FAILED_FILE, SUMMARY_FILE

        results: dict[int, JobReturn] = {}
        while len(results) < len(jobs):
            for k in [k for k, job in enumerate(jobs) if k not in results and job.done()]:
                run_dir, config = cells[k]
                results[k] = self._wait(jobs[k], job_overrides[k], run_dir, config)
                if (run_dir / SUMMARY_FILE).exists():
                    state = "done"
                elif (run_dir / FAILED_FILE).exists():
                    state = f"failed (its {FAILED_FILE})"
                else:  # a run that wrote neither: SLURM's word on it
                    state = jobs[k].state
                print(
                    f"cell #{indices[k]} ended {state} ({len(results)} of {len(jobs)} ended): {run_dir}",
                    file=sys.stderr,
                    flush=True,
                )
            if len(results) < len(jobs):
                time.sleep(1)
        return [results[k] for k in range(len(jobs))]

    @staticmethod
    def _job_return(overrides: Sequence[str], value: Any) -> JobReturn:
        result = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
        result.return_value = value
        return result

    @staticmethod
    def _until_it_leaves_the_queue(job_id: str, timeout: float = 300) -> None:
        """Wait while squeue still lists the job (COMPLETING): sacct says CANCELLED from the scancel
        on, while the run checkpoints and records why it stopped (within SLURM's KillWait)."""
        import time

        from hydra_plugins.horst_slurm.status import pending_reasons

        deadline = time.time() + timeout
        while job_id in pending_reasons([job_id]) and time.time() < deadline:
            time.sleep(2)

    def _wait(self, job: Any, overrides: Sequence[str], run_dir: Path, config: dict) -> JobReturn:
        """The cell's result; a job SLURM ended becomes a failed cell (`failed.json`)."""
        from submitit.core.utils import UncompletedJobError

        from horst_sparse.training.runner import record_failed_cell

        try:
            return self._job_return(overrides, job.results()[0])
        except (
            UncompletedJobError
        ) as error:  # FailedJobError too: an error outside the task (hydra_task records its own)
            self._until_it_leaves_the_queue(job.job_id)
            if (record := job_record(run_dir, job.job_id)) and record.get("slurm_job_id") == job.job_id:
                # The run recorded how it ended (a cancel: at which step, its checkpoint): its words stay.
                print(
                    f"error: cell {run_dir.name} failed ({record['reason']}); recorded in {run_dir / 'failed.json'}",
                    file=sys.stderr,
                )
                return self._job_return(overrides, record)
            state = job.state
            message = " ".join(str(error).strip().splitlines()[:2])  # which job, and what submitit saw
            reason = f"SLURM job {job.job_id} ended {state}: {message}"
            record = record_failed_cell(
                run_dir,
                pipeline=self.config.pipeline,
                reason=reason,
                exit_code=None,
                step=None,
                config=config,
                overrides=overrides,
                slurm_job_id=job.job_id,
                slurm_state=state,
            )
            print(
                f"error: cell {run_dir.name} failed ({reason}); recorded in {run_dir / 'failed.json'}", file=sys.stderr
            )
            return self._job_return(overrides, record)
