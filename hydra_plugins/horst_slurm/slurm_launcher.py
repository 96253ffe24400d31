"""hydra-submitit-launcher's SLURM launcher, made to survive what SLURM does to jobs.

* A cell that SLURM ends (`scancel`, out of memory, node failure, a hard time-out: submitit's
  `UncompletedJobError`) is a failed cell like one that fails in Python: its `failed.json`
  holds SLURM's state, the other cells go on and are collected, `RunCallbacks` lists it at
  the end and the multirun exits 1. (hydra-submitit-launcher's `launch` raises on the first
  such job, leaving the others running and recording nothing.)
* `wait: false` submits and returns once the jobs are queued.
* `<sweep dir>/jobs.json` names each cell's SLURM job and run folder, for
  `horst-sweep-status` (each cell's state; collects the finished ones); a sweep submitted
  again into its folder updates its cells there (`write_jobs_file`).
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


def write_jobs_file(sweep_dir: Path, *, pipeline: str, submitit_folder: str, cells: Sequence[dict]) -> None:
    """Record `cells` (each with its `run_dir`) in `<sweep_dir>/jobs.json`, after those already
    there: a sweeper's earlier batches stay, and a cell already listed (the same run folder:
    the sweep submitted again to continue it) takes its new job in its place, once."""
    path = sweep_dir / JOBS_FILE
    listed = {c["run_dir"]: c for c in json.loads(path.read_text())["cells"]} if path.exists() else {}
    listed.update({c["run_dir"]: c for c in cells})  # a dict keeps the first listing's place
    path.write_text(
        json.dumps({"pipeline": pipeline, "submitit_folder": submitit_folder, "cells": list(listed.values())}, indent=1)
    )


@dataclass
class HorstSlurmQueueConf(SlurmQueueConf):
    _target_: str = "hydra_plugins.horst_slurm.slurm_launcher.SlurmLauncher"
    # false: return once the jobs are queued (`horst-sweep-status <sweep dir>` follows them)
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

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra.core.singleton import Singleton

        folder, executor = self.params["submitit_folder"], self.executor()
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)

        indices = [initial_job_idx + i for i in range(len(job_overrides))]
        for index, overrides in zip(indices, job_overrides):
            log.info(f"\t#{index} : {' '.join(filter_overrides(overrides))}")
        arguments = [
            (list(o), "hydra.sweep.dir", i, f"job_id_for_{i}", Singleton.get_state())
            for i, o in zip(indices, job_overrides)
        ]
        cells = [self._cell(o, i) for i, o in zip(indices, job_overrides)]
        jobs = executor.map_array(self, *zip(*arguments))
        write_jobs_file(
            sweep_dir,
            pipeline=self.config.pipeline,
            submitit_folder=folder,
            cells=[
                {
                    "num": i,
                    "slurm_job_id": job.job_id,
                    "run_dir": str(run_dir),
                    "overrides": list(overrides),
                    "config": config,
                }
                for i, overrides, (run_dir, config), job in zip(indices, job_overrides, cells, jobs)
            ],
        )
        print(
            f"submitted {len(jobs)} cell(s) as SLURM job {jobs[0].job_id.split('_')[0]}; their state: "
            f"horst-sweep-status {sweep_dir}",
            file=sys.stderr,
        )
        if not self.wait:
            return [
                self._job_return(o, {"status": "submitted", "slurm_job_id": j.job_id})
                for o, j in zip(job_overrides, jobs)
            ]
        return self._wait_each_as_it_ends(indices, jobs, job_overrides, cells)

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

    def _wait(self, job: Any, overrides: Sequence[str], run_dir: Path, config: dict) -> JobReturn:
        """The cell's result; a job SLURM ended becomes a failed cell (`failed.json`)."""
        from submitit.core.utils import UncompletedJobError

        from horst_sparse.training.runner import record_failed_cell

        try:
            return self._job_return(overrides, job.results()[0])
        except (
            UncompletedJobError
        ) as error:  # FailedJobError too: an error outside the task (hydra_task records its own)
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
