"""The scaffolding around both pipelines' training loops, written once.

`Run` is what a pipeline's `run()` holds besides its model, data and loop:

* start-up: DDP from torchrun/SLURM/submitit, the config checks, the device, autocast dtype,
  seeds and threads, one run folder for every process, the preemption signal handler;
* `restore()`: continue from a checkpoint (`resume=auto|never|path`), refusing one written
  with other settings (the differing keys listed), then open the run log;
* `save()`: an atomic checkpoint with its marker in the log, the newest ones kept, and
  never one with non-finite weights;
* `check_finite()`: the non-finite-loss guard, naming the last good checkpoint;
* `preempted()` / `exit_for_requeue()`: SLURM's pre-timeout signal, checkpoint, requeue.

`hydra_task()` is the body of both entry points' `main`: it maps the errors a user can fix
to one line and an exit code, and in a multirun records a failed cell (`failed.json`) and
lets the sweep go on to the next one.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from horst._fast_path import failed_fast_paths
from horst_sparse import cpu_mode
from horst_sparse.pipeline import of as pipeline_of
from horst_sparse.training.checkpoint import (
    CheckpointError,
    checkpoint_path,
    checkpoint_step,
    gather_rng_states,
    latest_checkpoint,
    load_checkpoint,
    prune_old_checkpoints,
    resolve_resume,
    restore_rng_state,
    restore_training_state,
    save_checkpoint,
    step_checkpoint,
    training_state,
)
from horst_sparse.training.config import ConfigError, RunError
from horst_sparse.training.distributed import (
    barrier,
    broadcast_object,
    init_distributed,
    is_sharded,
    shutdown_distributed,
)
from horst_sparse.training.env import autocast_dtype, device_type, seed_everything, select_device
from horst_sparse.training.no_effect import NO_EFFECT
from horst_sparse.training.preemption import (
    PreemptionGuard,
    SlurmCancelled,
    command_line,
    hydra_override,
    slurm_job_id,
)
from horst_sparse.training.run_log import (
    CONFIG_FILE,
    FAILED_FILE,
    SUMMARY_FILE,
    RunLogger,
    environment,
    git_commit,
    labelled_output,
    write_json_atomic,
)
from horst_sparse.training.test_pacing import pace_step, seconds_per_step

NON_FINITE_EXIT_CODE = 4  # a run stopped by a non-finite loss (preemption's is 3)
LOCK_FILE = ".lock"  # one live writer per run folder (`lock_run_folder`)
_held_locks: dict[Path, Any] = {}  # run folders this process holds, by resolved path
_continue_command: str | None = None  # set by `hydra_task`: the command line that continues this run
# Set by `RunCallbacks.on_multirun_start`: the line that continues the whole sweep, which an
# interrupt of a cell run in this process (Hydra's basic launcher) prints instead of the cell's.
_sweep_command: str | None = None
_sweep: str | None = None  # set by `hydra_task` in a multirun: the sweep folder's name, the runs' W&B group
_open_run: Run | None = None  # the Run a task started and has not finished: `hydra_task` closes it whatever happens
# What `resume_override` may change on resume, and how the new value reaches the live objects.
OVERRIDABLE = ("train.lr", "train.base_lr", "train.min_lr", "optimizer.")


class NonFiniteLossError(RunError):
    """The training loss became NaN or infinite; no checkpoint is written after it."""

    exit_code = NON_FINITE_EXIT_CODE


def _dotted(config: Mapping[str, Any], key: str) -> Any:
    for part in key.split("."):
        config = config.get(part) if isinstance(config, Mapping) else None
    return config


def _apply_overrides(
    changes: Mapping[str, list], *, optimizer: torch.optim.Optimizer, scheduler: Any, lr: float
) -> None:
    """Put the new values of a resume into the restored optimizer and LR schedule."""
    for key, (_, new) in changes.items():
        if key in ("train.lr", "train.base_lr"):  # the schedule's peak: every group's base value
            scheduler.base_values = [lr for _ in scheduler.base_values]
            if scheduler.warmup_t:
                scheduler.warmup_steps = [
                    (v - scheduler.warmup_lr_init) / scheduler.warmup_t for v in scheduler.base_values
                ]
            for group in optimizer.param_groups:
                group["initial_lr"] = lr
        elif key == "train.min_lr":
            scheduler.lr_min = new
        else:  # optimizer.<hyperparameter>, in the groups that have it (decay only where there is decay)
            name = key.removeprefix("optimizer.")
            for group in optimizer.param_groups:
                if name in group and not (name == "weight_decay" and group[name] == 0):
                    group[name] = tuple(new) if isinstance(group[name], tuple) else new


def lock_run_folder(run_dir: Path) -> None:
    """Make this process the run folder's one writer, or stop with a one-line `RunError`.

    An advisory `flock` on `<run_dir>/.lock`: the kernel releases it when its process dies, so
    a lock left by a killed run is taken over (with a note) and a live one is refused. The
    file says who holds it. A process that already holds it (a run restarted in-process)
    keeps it."""
    import fcntl
    import socket

    key = run_dir.resolve()
    if key in _held_locks:
        return
    path = run_dir / LOCK_FILE
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")
    except OSError as error:
        raise RunError(
            f"cannot use run folder {run_dir}: {error.strerror}; choose a writable one (hydra.run.dir=...)"
        ) from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        owner = handle.read().strip() or "another process"
        handle.close()
        raise RunError(
            f"run folder {run_dir} is in use by {owner}; wait for that run to end, or choose another folder "
            "(hydra.run.dir=...)"
        ) from None
    handle.seek(0)
    previous = handle.read().strip()
    if previous:
        tqdm.write(f"note: took over {path} from {previous}, which is no longer running")
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    handle.flush()
    _held_locks[key] = handle


def release_run_folder(run_dir: Path) -> None:
    handle = _held_locks.pop(run_dir.resolve(), None)
    if handle is not None:
        (run_dir / LOCK_FILE).unlink(missing_ok=True)
        handle.close()


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any], *, ignore: Iterable[str] = ()) -> list[str]:
    """`key: old -> new` for every leaf that differs, dotted keys; `ignore` skips keys and
    whole sections by their dotted prefix."""
    ignore = tuple(ignore)
    differences = []

    def walk(a: Any, b: Any, prefix: str) -> None:
        if prefix and any(prefix == k or prefix.startswith(k + ".") for k in ignore):
            return
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for key in sorted(set(a) | set(b), key=str):
                walk(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{prefix}.{key}" if prefix else str(key))
        elif a != b and not (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b)):
            differences.append(f"{prefix}: {a} -> {b}")

    walk(old, new, "")
    return differences


def continue_command(pipeline: str, overrides: Iterable[str], run_dir: str | Path) -> str:
    """The shell line that continues the run in `run_dir`: the pipeline's entry point with the
    run's command-line `overrides` (but its folder and `resume_override`, a change made once) and
    `hydra.run.dir=<run_dir>`, quoted for Hydra's grammar and the shell: pasted, it runs."""
    kept = [o for o in overrides if not o.startswith(("hydra.run.dir=", "resume_override="))]
    return command_line(
        ["python", pipeline_of({"pipeline": pipeline}).script, *kept, hydra_override("hydra.run.dir", str(run_dir))]
    )


def sweep_command(config: DictConfig) -> str:
    """The shell line that continues the multirun whose config (Hydra's, with its `hydra` node)
    is `config`: the same command line (Hydra's overrides as typed) in that sweep's folder,
    whose finished cells are left as they are (`finished_summary`) and the others continue."""
    # as typed, unresolved: an override may hold an interpolation that only a job resolves
    # (hydra.sweep.subdir='${hydra.job.num}_...')
    overrides = OmegaConf.to_container(config.hydra.overrides, resolve=False)
    # `-m` says hydra.mode=MULTIRUN (Hydra adds it to the overrides); the folder is given below.
    kept = [
        o for o in [*overrides["hydra"], *overrides["task"]] if not o.startswith(("hydra.sweep.dir=", "hydra.mode="))
    ]
    sweep_dir = hydra_override("hydra.sweep.dir", str(config.hydra.sweep.dir))
    return command_line(["python", pipeline_of(config).script, "-m", *kept, sweep_dir])


class Run:
    """One training run's shared machinery; see the module docstring."""

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: str | Path,
        *,
        title: str,
        tags: Iterable[str] = (),
        epoch_metrics: tuple[str, ...] = (),
    ) -> None:
        """The pipeline is the one `cfg` names (its `pipeline` key): its checks run first, its name is
        W&B's job type, and its `lr_key` is the setting a non-finite loss asks to lower. `title` is
        the run's short name (unless `logging.name` sets one), `tags` its W&B tags besides
        `logging.tags`; `epoch_metrics` are charted against the epoch."""
        self.started = time.time()
        self.pipeline = pipeline_of(cfg)
        self.title, self.tags, self.epoch_metrics = title, list(tags), epoch_metrics
        self.dist = init_distributed(device_type(cfg.device))
        self.pipeline.checks.config(cfg, world_size=self.dist.world_size)
        self.cfg = cfg
        self.config = OmegaConf.to_container(cfg, resolve=True)
        self.device = select_device(cfg.device, local_rank=self.dist.local_rank)
        if cfg.reproducible_cpu and self.device.type == "cpu":
            if problem := cpu_mode.problem():
                raise RunError(f"reproducible_cpu=true, but {problem}")
            if not cfg.cpu_threads:  # the summation order follows the thread count
                raise RunError(
                    "reproducible_cpu=true needs a fixed cpu_threads: give cpu_threads=N, or reproducible_cpu=false"
                )
        # Each process's Hydra may pick its own time-stamped folder; all use the main process's.
        self.run_dir = Path(broadcast_object(str(run_dir)))
        if self.is_main:
            lock_run_folder(self.run_dir)
        self.dtype = autocast_dtype(cfg.precision, self.device)
        seed_everything(cfg.seed, deterministic=cfg.deterministic)
        if cfg.cpu_threads:
            torch.set_num_threads(cfg.cpu_threads)
        self.preemption = PreemptionGuard()  # SLURM's pre-timeout signal: checkpoint, then requeue
        # The non-finite-loss guard, kept on the device (`watch_loss`): the first bad step and its loss.
        self._bad_step = torch.full((), -1, dtype=torch.long, device=self.device)
        self._bad_loss = torch.zeros((), device=self.device)
        self.log: RunLogger | None = None
        self.elapsed_before = 0.0  # wall time of the runs this one continues
        self.resume_overrides: list[dict] = []  # settings changed on resume: step and (old, new) values
        self.continue_command = (
            _continue_command or f"the same command with {hydra_override('hydra.run.dir', str(self.run_dir))}"
        )
        self._tracked: dict[str, Any] = {}
        global _open_run
        _open_run = self

    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    @property
    def elapsed_s(self) -> float:
        return self.elapsed_before + time.time() - self.started

    def restore(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        generators: dict[str, torch.Generator] | None = None,
        lr: float,
        may_change: Iterable[str] = (),
        check: Callable[[dict, Path], None] | None = None,
        position: Callable[[dict], str] = lambda state: f"step {state['step']}",
    ) -> dict[str, Any] | None:
        """Load the checkpoint `resume` names into the live objects and open the run log.

        Returns the checkpoint's other entries (`step` and the pipeline's extras), or None
        for a fresh start. A checkpoint written with other settings than `horst_sparse.training.no_effect.NO_EFFECT`
        and the pipeline's `may_change` is refused, naming every differing key; `check` adds
        the pipeline's own conditions; `position` says where the run continues.

        The keys listed in `resume_override` (the learning rate, `train.min_lr`, optimizer
        hyperparameters; e.g. after a non-finite loss) take their new values: `lr` is the
        run's peak lr as configured now. The change and its step are logged and kept in the
        checkpoints and the summary."""
        self._tracked = dict(model=model, optimizer=optimizer, scheduler=scheduler, generators=generators)
        overrides = list(self.cfg.resume_override)
        for key in overrides:
            # whole keys (train.lrr is not train.lr); an optimizer hyperparameter by its prefix
            if not (key in OVERRIDABLE or key.startswith("optimizer.")) or key in (
                "optimizer.name",
                "optimizer._target_",
                "optimizer._partial_",
            ):
                raise ConfigError(
                    f"resume_override has {key}: only train.lr, train.base_lr, train.min_lr and optimizer "
                    "hyperparameters can change when a run continues"
                )
        path = resolve_resume(self.cfg.resume, self.run_dir)
        state = None
        if path is not None:
            state = load_checkpoint(path, weights=not is_sharded(model))  # FSDP2: read below
            ignore = NO_EFFECT + tuple(may_change) + ("resume_override", *overrides)
            differences = config_differences(state["config"], self.config, ignore=ignore)
            if differences:
                raise CheckpointError(
                    f"{path} was written with other settings ({'; '.join(differences)}); rerun with its settings, "
                    "list the keys to change in resume_override=[...] (learning rate and optimizer settings only), "
                    "or start a new run folder (hydra.run.dir=...) or resume=never"
                )
            if check is not None:
                check(state, path)
            changes = {
                key: [old, new]
                for key in overrides
                if (old := _dotted(state["config"], key)) != (new := _dotted(self.config, key))
            }
            state = restore_training_state(
                state, model=model, optimizer=optimizer, scheduler=scheduler, generators=generators, path=path
            )
            # Each process's own RNG states (drop path, dropout, ...), where as many processes wrote them;
            # else every process continues from the main one's.
            ranks = state.pop("rng_ranks", None)
            if ranks and len(ranks) == self.dist.world_size:
                restore_rng_state(ranks[self.dist.rank], generators)
            self.elapsed_before = state.get("elapsed_s", 0.0)
            self.resume_overrides = list(state.get("resume_overrides", []))
            if changes:
                _apply_overrides(changes, optimizer=optimizer, scheduler=scheduler, lr=lr)
                self.resume_overrides.append({"step": state["step"], "changes": changes})
            scheduler.step_update(state["step"])
        logging = self.cfg.logging
        self.log = RunLogger(
            self.run_dir,
            self.config,
            enabled=self.is_main,
            project=logging.project,
            name=logging.name or self.title,
            group=logging.group or _sweep,
            tags=[*self.tags, *logging.tags],
            job_type=self.pipeline.name,
            epoch_metrics=self.epoch_metrics,
            mode=logging.mode,
            resume_step=state["step"] if state else None,
        )
        if state and self.is_main:
            tqdm.write(f"resumed from {path} at {position(state)}")
            if self.resume_overrides and self.resume_overrides[-1]["step"] == state["step"]:
                changes = self.resume_overrides[-1]["changes"]
                self.log.log({"event": "resume_override", "changes": changes}, step=state["step"])
                tqdm.write("changed on resume: " + "; ".join(f"{k}: {a} -> {b}" for k, (a, b) in changes.items()))
        return state

    def save(self, *, step: int, **extra: Any) -> None:
        """Checkpoint the tracked objects at `step` with the pipeline's `extra` state (main
        process writes, all wait). Never after a non-finite loss (`check_losses` first), never
        with weights that are not finite."""
        self.check_losses()
        model = self._tracked["model"]
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            raise NonFiniteLossError(
                f"the weights are not finite at step {step}; no checkpoint written. {self._recovery_hint()}"
            )
        sharded = is_sharded(model)  # FSDP2: every process writes its shards (a DCP folder)
        # Under DDP each process's RNG states, by rank (a collective); `training_state` has the main one's.
        ranks = {"rng_ranks": gather_rng_states(self._tracked["generators"])} if self.dist.enabled else {}
        path = checkpoint_path(self.run_dir, step, sharded=sharded)
        if self.is_main:
            self.log.checkpoint(path, step=step)  # before the file: a resume from it always finds its marker
        if self.is_main or sharded:
            state = training_state(
                **self._tracked,
                step=step,
                config=self.config,
                elapsed_s=self.elapsed_s,
                resume_overrides=self.resume_overrides,
                **ranks,
                **extra,
            )
            save_checkpoint(state, path)
        if self.is_main:
            prune_old_checkpoints(self.run_dir, keep=self.cfg.train.keep_checkpoints)
        barrier()

    def watch_loss(self, loss: torch.Tensor, *, step: int) -> None:
        """Note `loss` (the one all processes agree on) of `step` if it is the first non-finite
        one, on the device: no host sync, so the CPU can run ahead of the GPU. `check_losses`
        reads it, at log intervals and before every checkpoint."""
        first = ~torch.isfinite(loss) & (self._bad_step < 0)
        self._bad_step = torch.where(first, step, self._bad_step)
        self._bad_loss = torch.where(first, loss.detach().float(), self._bad_loss)
        # Once per optimizer step in both pipelines: the test suite's pacing (test_pacing), else nothing.
        self._paced_at = pace_step(getattr(self, "_paced_at", self.started))

    def check_losses(self) -> None:
        """Stop (`NonFiniteLossError`) if a watched loss was not finite. One host sync."""
        bad_step = int(self._bad_step.item())
        if bad_step >= 0:
            self.check_finite(
                self._bad_loss.item(), step=bad_step, hint=f"{self.pipeline.configs.lr_key} (or optimizer.alpha)"
            )

    def check_finite(self, loss: float, *, step: int, hint: str) -> None:
        """Stop if `loss` (of `step`, the one all processes agree on) is NaN or inf.

        The checkpoint of step - 1, if any, holds the very weights that gave this loss: it is
        set aside as `*.pt.diverged` (kept, but never resumed from), so the last good
        checkpoint is the newest one left."""
        if not math.isfinite(loss):
            diverged = step_checkpoint(self.run_dir, step - 1)
            note = ""
            if self.is_main and diverged is not None:
                diverged.rename(diverged.with_name(diverged.name + ".diverged"))
                note = f"{diverged.name} holds the weights that gave it: kept as {diverged.name}.diverged. "
            barrier()
            error = NonFiniteLossError(
                f"training loss is {loss} at step {step}; stopped before the next checkpoint. "
                f"{note}{self._recovery_hint(hint)}"
            )
            error.step = step
            raise error

    def _recovery_hint(self, hint: str = "train.lr") -> str:
        last = latest_checkpoint(self.run_dir)
        if last is None:
            return f"Last good checkpoint: none yet. Lower {hint} and start again"
        key = hint.split()[0]
        return (
            f"Last good checkpoint: {last}. Lower {hint} and continue from it: {self.continue_command} "
            f"with the lower value and resume_override=[{key}]"
        )

    def preempted(self) -> bool:
        """Whether SLURM's pre-timeout signal arrived (on any process: a collective under DDP,
        so every process must ask at the same step)."""
        return self.preemption.requested()

    def exit_for_requeue(self, *, step: int, bar: tqdm | None = None, save: bool = True, **extra: Any) -> None:
        """Checkpoint (unless `save=False`: the checkpoint of `step` exists), then hand over to
        submitit's requeue (or exit with code 3). Does not return."""
        if save:
            self.save(step=step, **extra)
        if bar is not None:
            bar.close()
        self.log.close()
        if self.log.offline_dir is not None:
            # The folder just named goes when the run continues (offline, W&B cannot append to it):
            # the continued run logs the same W&B run, id and all, into a new one.
            offline = self.log.offline_dir
            run_id = offline.name.rsplit("-", 1)[-1]
            print(
                "W&B: continuing the run replaces that folder with one of the same W&B run; "
                f"`wandb sync {command_line([str(offline.parent)])}/offline-run-*-{run_id}` uploads whichever is there",
                flush=True,
            )
        self.preemption.requeue_or_exit(continue_command=_sweep_command or self.continue_command, step=step)

    def finish(self, summary: Mapping[str, Any], *, files: tuple[str, ...] = ()) -> dict[str, Any]:
        """Write `summary.json` (a W&B artifact with the run folder's `files`), then `close`;
        returns the summary. It records horst's fast paths that fell back to a slower one
        (`fast_path_fallbacks`), and a run that had any ends with a line that says so."""
        self.preemption.close()
        numbers = self.pipeline.numbers(self.config, summary)
        fallbacks = _fast_path_fallbacks()
        data = self.log.summary(
            {
                **summary,
                "numbers": numbers,
                "wall_time_s": self.elapsed_s,
                "resume_overrides": self.resume_overrides,
                "fast_path_fallbacks": fallbacks,
            },
            files=files,
        )
        if self.is_main:
            (self.run_dir / FAILED_FILE).unlink(missing_ok=True)  # an earlier failure of this cell, now done
            if fallbacks:
                print(
                    f"warning: horst's fast path failed in this run ({', '.join(fallbacks)}) and a slower one took "
                    f"over (the warning above says why): its step times are not comparable ({SUMMARY_FILE}: "
                    "fast_path_fallbacks)",
                    file=sys.stderr,
                    flush=True,
                )
        self.close()
        return data

    def close(self, *, exit_code: int = 0) -> None:
        """Give back what the run holds: the signal handler, the log (its W&B run ends with
        `exit_code`), the run folder's lock. Idempotent. `hydra_task` calls it with the error's
        exit code when the task raised: in a one-process multirun the next cell would otherwise
        inherit the handler, and W&B would mark the failed cell's run finished when the next
        one starts."""
        global _open_run
        self.preemption.close()
        if self.log is not None:
            self.log.close(exit_code=exit_code)
        if self.is_main:
            release_run_folder(self.run_dir)
        if _open_run is self:
            _open_run = None


class RunCallbacks(Callback):
    """Hydra callbacks of both entry points (`hydra.callbacks` in their configs).

    Before Hydra creates the run (or sweep) folder: a folder that cannot be written is one
    line and exit status 2, not a traceback from Hydra's `mkdir`. At the end of a multirun:
    one line per failed cell (its `failed.json`), the line that continues the sweep
    (`sweep_command`) and exit status 1 if any failed; the sweep ran every cell, and the shell
    still learns of the failures."""

    @staticmethod
    def _check_writable(folder: Path, key: str) -> None:
        probe = folder / f".write_probe_{os.getpid()}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe.write_text("")
            probe.unlink()
        except OSError as error:
            sys.exit(
                f"error: {key}={folder} cannot be written ({error.strerror}); choose a writable folder ({key}=...)"
            )

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.instance().set_config(config)  # the folder's name reads ${hydra:runtime.choices.model}
        self._check_writable(Path(config.hydra.run.dir), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _sweep_command
        self._check_writable(Path(config.hydra.sweep.dir), "hydra.sweep.dir")
        _sweep_command = sweep_command(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global _sweep_command
        _sweep_command = None
        if not config.hydra.launcher.get("wait", True):
            return  # the cells are only queued (a failed.json here is an earlier try's): horst-sparse status follows them
        failed = sorted(Path(config.hydra.sweep.dir).glob(f"*/{FAILED_FILE}"))
        for path in failed:
            record = json.loads(path.read_text())
            print(f"failed cell {path.parent}: {record['reason']}", file=sys.stderr)
        if failed:
            print(f"continue the sweep (its finished cells are kept) with: {sweep_command(config)}", file=sys.stderr)
            sys.exit(f"{len(failed)} cell(s) of this multirun failed (listed above); the others ran")


def _remove_if_untouched(run_dir: Path) -> None:
    """Delete a run folder in which nothing but Hydra's own files was written (a run refused
    at start-up), so refused runs leave no empty folders behind."""
    import shutil

    ours = [p for p in run_dir.iterdir() if p.name not in (".hydra", LOCK_FILE)] if run_dir.is_dir() else []
    if run_dir.is_dir() and not ours:
        release_run_folder(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)


def _close_open_run(exit_code: int) -> None:
    if _open_run is not None:
        _open_run.close(exit_code=exit_code)


def _fast_path_fallbacks() -> list[str]:
    """horst's fast paths that failed in any process of the run (a collective under DDP: one
    slow process slows every step)."""
    failed = failed_fast_paths()
    if dist.is_initialized():
        gathered: list[list[str] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, failed)
        failed = sorted(set().union(*gathered))
    return failed


def record_failed_cell(
    run_dir: Path,
    *,
    pipeline: str,
    reason: str,
    exit_code: int | None,
    step: int | None,
    config: Mapping[str, Any] | None,
    overrides: Sequence[str] | None = None,
    **extra: Any,
) -> dict:
    """Write a failed cell's `failed.json` (what `RunCallbacks`, `horst-sparse tables` and
    `horst-sparse status` read) and return it. `step`: where it failed, if known (None for a
    job SLURM ended). `checkpoint` and `checkpoint_step`: the newest checkpoint in the folder,
    where the run continues; `continue`: the line that continues it (`continue_command`, from
    the cell's command-line `overrides`; None without them). `extra`: e.g. the SLURM job and
    its state."""
    numbers = pipeline_of({"pipeline": pipeline}).numbers(config, None) if config else []  # what it would have measured
    last = latest_checkpoint(run_dir)
    record = {
        "pipeline": pipeline,
        "status": "failed",
        "exit_code": exit_code,
        "reason": reason,
        "step": step,
        "checkpoint": str(last) if last else None,
        "checkpoint_step": checkpoint_step(last) if last else None,
        "continue": continue_command(pipeline, overrides, run_dir) if overrides is not None else None,
        **extra,
        "git_commit": git_commit(Path(__file__).parent),
        "config": config,
        "numbers": numbers,
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / FAILED_FILE, record)
    return record


def finished_summary(run_dir: Path, config: Mapping[str, Any]) -> dict | None:
    """The summary of the run that already finished in `run_dir` with these settings (those
    of `horst_sparse.training.no_effect.NO_EFFECT` aside), else None. A job SLURM requeues after it finished (one
    that ended within its grace period after SIGTERM) or the same command typed again then
    changes nothing: no second training, no rewritten summary, no appended metrics."""
    summary, written = run_dir / SUMMARY_FILE, run_dir / CONFIG_FILE
    if not (summary.is_file() and written.is_file()):
        return None
    if config_differences(yaml.safe_load(written.read_text()), config, ignore=NO_EFFECT):
        return None  # other settings: `Run.restore` names them, or evaluates anew
    return json.loads(summary.read_text())


def _record_failure(
    run_dir: Path,
    cfg: DictConfig,
    overrides: Sequence[str],
    *,
    reason: str,
    exit_code: int,
    step: int | None,
    **extra: Any,
) -> dict:
    """`record_failed_cell` for a task that `hydra_task` ran with `cfg` and the command-line `overrides`;
    in a SLURM job it names the job, so that a record of an earlier try is told from this one's."""
    job = {"slurm_job_id": job_id} if (job_id := slurm_job_id()) else {}
    return record_failed_cell(
        run_dir,
        pipeline=cfg.pipeline,
        reason=reason,
        exit_code=exit_code,
        step=step,
        config=OmegaConf.to_container(cfg, resolve=True),
        overrides=list(overrides),
        environment=environment(),  # where it failed: a diverged run's machine is part of its outcome
        **job,
        **extra,
    )


def hydra_task(task: Callable[..., dict], cfg: DictConfig) -> dict | None:
    """Run `task(cfg, run_dir=...)` in Hydra's run folder; the body of both entry points.

    Errors a user can fix (`RunError`) are one line on stderr and the error's exit code.
    In a multirun every failure, including an unexpected exception, is recorded in the cell's
    `failed.json` (reason, exit code, config) and the sweep goes on with the next cell.
    A run folder that holds this run, finished, is left as it is (`finished_summary`)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from horst_sparse.training.optim import check_label

    global _continue_command, _sweep
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    try:
        check_label(cfg.optimizer)
    except RunError as error:
        tqdm.write(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    if cfg.resume == "auto" and (done := finished_summary(run_dir, OmegaConf.to_container(cfg, resolve=True))):
        print(f"{run_dir} holds this run, finished ({SUMMARY_FILE}); nothing to do (resume=never trains it again)")
        return done
    _continue_command = continue_command(cfg.pipeline, hydra_cfg.overrides.task, run_dir)
    _sweep = Path(hydra_cfg.sweep.dir).name if multirun else None
    exit_code = 1  # what an unfinished run's log ends with, unless a RunError says otherwise
    # a multirun's cells may run side by side (joblib): each line they print names its cell
    try:
        with labelled_output(f"{cfg.pipeline} {hydra_cfg.sweep.subdir}") if multirun else contextlib.nullcontext():
            seconds_per_step()  # the test suite's knob set outside it: one line before anything starts
            return task(cfg, run_dir=run_dir)
    except SlurmCancelled as cancelled:  # checkpointed and ends; the cell is failed until the sweep continues it
        exit_code = cancelled.code
        if multirun:
            _record_failure(
                run_dir,
                cfg,
                hydra_cfg.overrides.task,
                reason=cancelled.reason,
                exit_code=exit_code,
                step=cancelled.step,
                slurm_state=cancelled.state,
            )
        raise
    except RunError as error:
        reason, exit_code, step = str(error), error.exit_code, getattr(error, "step", None)
        if "Original Traceback" in reason:  # re-raised from a DataLoader worker: the original message
            reason = reason.strip().splitlines()[-1].split(": ", 1)[-1]
        tqdm.write(f"error: {reason}", file=sys.stderr)  # below any progress bar still on screen
        if not multirun:
            _remove_if_untouched(run_dir)
            if exit_code == NON_FINITE_EXIT_CODE and run_dir.is_dir():  # tables tell a diverged run from a killed one
                _record_failure(run_dir, cfg, hydra_cfg.overrides.task, reason=reason, exit_code=exit_code, step=step)
            sys.exit(exit_code)
    except Exception as error:
        if not multirun:
            raise
        traceback.print_exc()
        reason, exit_code, step = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}", 1, None
    finally:
        _continue_command = _sweep = None
        _close_open_run(exit_code)  # a finished run closed itself; a preempted one has closed its log
        shutdown_distributed()
    record = _record_failure(run_dir, cfg, hydra_cfg.overrides.task, reason=reason, exit_code=exit_code, step=step)
    print(
        f"error: cell {hydra_cfg.job.num} failed ({reason}); recorded in {run_dir / FAILED_FILE}, going on",
        file=sys.stderr,
    )
    return record
