"""Checkpoints: atomic writes, `weights_only` loads, RNG state capture, latest-checkpoint lookup.

A checkpoint is one `torch.save`d dict of tensors and plain values (model, optimizer, LR
schedule, RNG states, step/epoch, masks, config; the caller decides the keys). It is written
to a temporary name and renamed, so a run killed mid-write never leaves a file that looks
complete, and loaded with `weights_only=True`, so loading never executes pickled code.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.config import RunError

_NAME = "ckpt_{step:08d}.pt"
_PATTERN = re.compile(r"ckpt_(\d+)\.pt$")


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


def restore_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator] | None = None) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state({**np_state, "state": {**np_state["state"], "key": np_state["state"]["key"].numpy()}})
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
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
    """Write `state` to `path` atomically (temporary file in the same folder, then rename).

    A folder that cannot take the file (full disk or quota, read-only, no permission) is a
    one-line `CheckpointError` naming the folder and the space needed; the partial
    temporary file is removed, and earlier checkpoints are untouched."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as error:  # torch's writer reports a full disk as a RuntimeError
        with contextlib.suppress(OSError):  # nothing to remove in a read-only folder
            tmp.unlink(missing_ok=True)
        raise CheckpointError(f"cannot write checkpoint {path.name}: {write_problem(path.parent, error, _tensor_bytes(state))}") from None
    return path


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


def load_checkpoint(path: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises several types for truncated/garbled files
        raise CheckpointError(
            f"checkpoint {path} is unreadable (corrupt or truncated: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); delete it to resume from an earlier "
            "checkpoint, or start a new run folder"
        ) from error


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints in `run_dir`, oldest first (temporary files are ignored)."""
    found = [(int(m.group(1)), p) for p in Path(run_dir).glob("ckpt_*.pt") if (m := _PATTERN.search(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / _NAME.format(step=step)


def resolve_resume(resume: str | None, run_dir: str | os.PathLike) -> Path | None:
    """`auto`: the latest checkpoint in the run folder, if any; `never`/None: start fresh;
    anything else: a checkpoint file that must exist."""
    if resume in (None, "", "never", "none"):
        return None
    if resume == "auto":
        return latest_checkpoint(run_dir)
    path = Path(resume)
    if not path.is_file():
        raise CheckpointError(f"resume={resume}: no such checkpoint file (use resume=auto or resume=never)")
    return path


def prune_old_checkpoints(run_dir: str | os.PathLike, *, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints."""
    for path in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
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
    process's (the main process's in DDP: data order comes from shared generators)."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
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
) -> dict[str, Any]:
    """Load what `training_state` saved into live objects; returns the remaining entries
    (`step`, `config` and the extras)."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    restore_rng_state(state["rng"], generators)
    return {k: v for k, v in state.items() if k not in ("model", "optimizer", "scheduler", "rng")}
