"""Checkpoints: atomic writes, `weights_only` loads, RNG state capture, latest-checkpoint lookup.

A checkpoint is one `torch.save`d dict of tensors and plain values (model, optimizer, LR
schedule, RNG states, step/epoch, masks, config; the caller decides the keys). It is written
to a temporary name and renamed, so a run killed mid-write never leaves a file that looks
complete, and loaded with `weights_only=True`, so loading never executes pickled code.

A model sharded by FSDP2 is checkpointed with `torch.distributed.checkpoint` (DCP) into a
folder `ckpt_<step>.dcp`: every process writes its own shards of the model and optimizer
(`get_state_dict`), the main process the other entries (`state.pt`, as in a file); written
as `.dcp.tmp` and renamed. A resume reads each process's shards back (`set_state_dict`);
`load_checkpoint` can also read the folder whole, without a process group. DCP's own index
(`.metadata`) and the optimizer's non-tensor values are pickles that torch's reader loads:
resume only from folders you trust.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from horst_sparse.training.config import RunError
from horst_sparse.training.distributed import barrier, gather_objects, is_sharded
from horst_sparse.training.preemption import hydra_override

_NAME = "ckpt_{step:08d}.pt"
_SHARDED_NAME = "ckpt_{step:08d}.dcp"  # a DCP folder
_PATTERN = re.compile(r"ckpt_(\d+)\.(pt|dcp)$")
_SHARDED_ENTRIES = ("model", "optimizer")  # in a DCP folder, the DTensor state dicts; the rest in state.pt
_SMALL_ENTRIES = "state.pt"


class CheckpointError(RunError):
    """A checkpoint that cannot be read."""


def capture_rng_state(generators: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Python, numpy, torch (CPU and every CUDA device) and named generators' RNG states."""
    np_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        # numpy's key array becomes a tensor so that `weights_only` loading accepts it.
        "numpy": {**np_state, "state": {**np_state["state"], "key": torch.from_numpy(np_state["state"]["key"].copy())}},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }


def gather_rng_states(generators: dict[str, torch.Generator] | None = None) -> list[dict[str, Any]]:
    """`capture_rng_state` of every process, by rank, on every process (a collective), each as
    `load_checkpoint` returns it (they travel as `torch.save` bytes: the object collectives do
    not carry tensors' storages whole)."""
    buffer = io.BytesIO()
    torch.save(capture_rng_state(generators), buffer)
    return [torch.load(io.BytesIO(data), weights_only=True) for data in gather_objects(buffer.getvalue())]


def restore_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator] | None = None) -> None:
    """Put back what `capture_rng_state` saved, as `load_checkpoint` returns it: every torch
    state a CPU ByteTensor, whichever device it drives. CUDA states go to the devices this
    process sees, up to as many as were saved (a job may see fewer GPUs after a requeue)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state({**np_state, "state": {**np_state["state"], "key": np_state["state"]["key"].numpy()}})
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        for device, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)
    for name, g in (generators or {}).items():
        g.set_state(state["generators"][name])


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write `state` to `path` atomically (temporary name in the same folder, then rename).

    A `.dcp` path (`checkpoint_path(..., sharded=True)`) is a collective: every process calls
    it with its own `training_state` and writes its shards. A file is written by the caller
    alone. A folder that cannot take the checkpoint (full disk or quota, read-only, no
    permission) is a one-line `CheckpointError` naming the folder and the space needed; the
    partial temporary file or folder is removed, and earlier checkpoints are untouched."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    sharded = path.suffix == ".dcp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if sharded:
            _save_shards(state, tmp)
        else:
            torch.save(state, tmp)
        if not sharded or _is_main():
            os.replace(tmp, path)
    except (OSError, RuntimeError) as error:  # torch's writer reports a full disk as a RuntimeError
        with contextlib.suppress(OSError):  # nothing to remove in a read-only folder
            shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        raise CheckpointError(
            f"cannot write checkpoint {path.name}: {write_problem(path.parent, error, _tensor_bytes(state))}"
        ) from None
    return path


def _is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _save_shards(state: dict[str, Any], folder: Path) -> None:
    """DCP: each process's shards of the model and optimizer, then the main process's other
    entries as `state.pt`. On return every process's shards are on disk (DCP's last step
    waits for all, and writes its index)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    if _is_main():
        shutil.rmtree(folder, ignore_errors=True)  # left by a write that was interrupted
    barrier()
    try:
        dcp.save({key: state[key] for key in _SHARDED_ENTRIES}, checkpoint_id=folder)
    except CheckpointException as error:  # every process's failures, in one BaseException; their text names the cause
        raise RuntimeError(str(error)) from error
    if _is_main():
        torch.save({k: v for k, v in state.items() if k not in _SHARDED_ENTRIES}, folder / _SMALL_ENTRIES)


def write_problem(folder: Path, error: Exception, needed: int) -> str:
    """One line on why `folder` refused a write of about `needed` bytes, with the fix."""
    import errno
    import shutil

    code = getattr(error, "errno", None)
    if code is None:  # torch's writer: a RuntimeError whose text carries the strerror
        code = next((c for c in (errno.EROFS, errno.EACCES, errno.ENOSPC) if os.strerror(c) in str(error)), None)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"{folder} is not writable ({os.strerror(code)}); choose a writable run folder (hydra.run.dir=...)"
    if code in (errno.ENOSPC, errno.EDQUOT) or (free is not None and free < needed) or "unexpected pos" in str(error):
        return (
            f"no space left in {folder} (about {needed / 2**20:,.1f} MiB needed, "
            f"{(free or 0) / 2**20:,.1f} MiB free); free space or raise the quota, then rerun to resume"
        )
    return f"{folder}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def load_checkpoint(path: str | os.PathLike, *, weights: bool = True) -> dict[str, Any]:
    """The dict a checkpoint holds, every tensor on the CPU whatever device wrote it. A DCP
    folder: its `state.pt` entries and its model and optimizer read whole (full state dicts; no
    process group needed), or with `weights=False` not at all: a resuming run's
    `restore_training_state` reads each process's shards.

    On the CPU, not the run's device: the RNG states must be CPU ByteTensors, and torch's
    `Optimizer.load_state_dict` keeps a non-fused optimizer's `step` counters where they load
    (a CUDA one would cost a host sync every step); `load_state_dict` of the model and the
    optimizer moves the rest onto the parameters' devices."""
    path = Path(path)
    sharded = path.is_dir()
    if not (path / _SMALL_ENTRIES if sharded else path).is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path / _SMALL_ENTRIES if sharded else path, map_location="cpu", weights_only=True)
        if sharded and weights:
            state.update(_read_whole(path))
        return state
    except Exception as error:  # torch raises several types for truncated/garbled files
        earlier = [p for p in list_checkpoints(path.parent) if checkpoint_step(p) < checkpoint_step(path)]
        fix = (
            f"the checkpoint before it is {earlier[-1]}: continue from it with {hydra_override('resume', str(earlier[-1]))}"
            if earlier
            else "no earlier checkpoint in its folder: delete it to start again"
        )
        raise CheckpointError(
            f"checkpoint {path} is unreadable (corrupt or truncated: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); {fix}, or start a new run folder"
        ) from error


def _read_whole(folder: Path) -> dict[str, Any]:
    """A DCP folder's tensors as whole tensors in this process, as torch's own converter
    (`format_utils.dcp_to_torch_save`) reads them."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    whole: dict[str, Any] = {}
    _load_state_dict(whole, storage_reader=FileSystemReader(folder), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return whole


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints in `run_dir`, oldest first (temporary files are ignored)."""
    found = [(int(m.group(1)), p) for p in Path(run_dir).glob("ckpt_*") if (m := _PATTERN.search(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step a checkpoint's name carries (`ckpt_00000228.pt`: 228); -1 for another name."""
    match = _PATTERN.search(Path(path).name)
    return int(match.group(1)) if match else -1


def step_checkpoint(run_dir: str | os.PathLike, step: int) -> Path | None:
    """The checkpoint of `step` in `run_dir` (a file or a DCP folder), if there is one."""
    return next((p for p in list_checkpoints(run_dir) if checkpoint_step(p) == step), None)


def checkpoint_path(run_dir: str | os.PathLike, step: int, *, sharded: bool = False) -> Path:
    """The checkpoint of `step`: a file, or for a sharded (FSDP2) model a DCP folder."""
    return Path(run_dir) / (_SHARDED_NAME if sharded else _NAME).format(step=step)


def resolve_resume(resume: str | None, run_dir: str | os.PathLike) -> Path | None:
    """`auto`: the latest checkpoint in the run folder, if any; `never`/None: start fresh;
    anything else: a checkpoint (a file, or an FSDP2 run's DCP folder) that must exist."""
    if resume in (None, "", "never", "none"):
        return None
    if resume == "auto":
        return latest_checkpoint(run_dir)
    path = Path(resume)
    if not path.exists():
        raise CheckpointError(f"resume={resume}: no such checkpoint file (use resume=auto or resume=never)")
    return path


def prune_old_checkpoints(run_dir: str | os.PathLike, *, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints."""
    for path in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        if path.is_dir():  # renamed first: a folder half deleted never looks like a checkpoint
            doomed = path.with_name(path.name + ".deleted")
            os.replace(path, doomed)
            shutil.rmtree(doomed)
        else:
            path.unlink(missing_ok=True)


def training_state(
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    step: int,
    config: dict[str, Any],
    generators: dict[str, torch.Generator] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The standard checkpoint content; `extra` holds pipeline state such as `epoch`,
    `masks` (a Sparsifier's state dict) or elapsed time. RNG states are the calling
    process's (the main process's in DDP: data order comes from shared generators).

    A model sharded by FSDP2 gives this process's DTensor shards (`get_state_dict`, keyed by
    parameter name; a collective) for `save_checkpoint` to write as a DCP folder."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(model, optimizer)
    else:
        model_state, optimizer_state = model.state_dict(), optimizer.state_dict()
    return {
        "model": model_state,
        "optimizer": optimizer_state,
        "scheduler": scheduler.state_dict(),
        "rng": capture_rng_state(generators),
        "step": step,
        "config": config,
        **extra,
    }


def restore_training_state(
    state: dict[str, Any],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    generators: dict[str, torch.Generator] | None = None,
    path: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Load what `training_state` saved into live objects; returns the remaining entries
    (`step`, `config` and the extras). A model sharded by FSDP2 reads its shards from the DCP
    folder `path` (a collective)."""
    if is_sharded(model):
        _load_shards(path, model, optimizer)
    else:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    restore_rng_state(state["rng"], generators)
    return {k: v for k, v in state.items() if k not in ("model", "optimizer", "scheduler", "rng")}


def _load_shards(folder: str | os.PathLike | None, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Each process reads its own shards into the live DTensors."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if folder is None or not Path(folder).is_dir():
        raise CheckpointError(
            f"checkpoint {folder} is not a DCP folder; a model sharded by FSDP2 resumes from ckpt_*.dcp"
        )
    model_state, optimizer_state = get_state_dict(model, optimizer)  # the shapes and shardings to read into
    shards = {"model": model_state, "optimizer": optimizer_state}
    try:
        dcp.load(shards, checkpoint_id=folder)
    except CheckpointException as error:
        raise CheckpointError(
            f"checkpoint {folder} does not fit this model and optimizer: {str(error).splitlines()[0]}"
        ) from None
    set_state_dict(model, optimizer, model_state_dict=shards["model"], optim_state_dict=shards["optimizer"])
