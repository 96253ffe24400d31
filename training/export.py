"""What every pipeline's export shares, knowing no pipeline: reading a run folder (its latest
checkpoint, config and summary) and the model card's common lines.

Each pipeline writes its own format over this: `training.gpt2.export` a `transformers`
folder, `training.vit.export` a timm folder; `scripts/export.py` picks one by `--to`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from training.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from training.run_log import SUMMARY_FILE, git_commit


@dataclass
class RunFolder:
    """A run folder as an export reads it."""

    path: Path
    state: dict[str, Any]  # the latest checkpoint
    cfg: DictConfig  # the config it was written with
    summary: dict[str, Any]  # summary.json; {} for an unfinished run

    @property
    def pipeline(self) -> str:
        """The `arch` of the run's model preset: gpt2 | vit."""
        return str(self.cfg.model.get("arch"))


def read_run(run_dir: str | Path) -> RunFolder:
    """The latest checkpoint, config and summary of `run_dir`; a `CheckpointError` if it has
    no checkpoint."""
    run_dir = Path(run_dir)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise CheckpointError(f"{run_dir} has no checkpoint (ckpt_*.pt); is it a run folder?")
    state = load_checkpoint(checkpoint)
    summary_path = run_dir / SUMMARY_FILE
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return RunFolder(run_dir, state, OmegaConf.create(state["config"]), summary)


def optimizer_line(cfg) -> str:
    """`name (setting=value, ...)` of the run's optimizer, for the card."""
    opt = OmegaConf.to_container(cfg.optimizer, resolve=True)
    settings = ", ".join(f"{k}={v}" for k, v in opt.items() if k not in ("name", "_target_", "_partial_"))
    return f"{opt.get('name')} ({settings})"


def commits(summary: dict) -> str:
    """The card's provenance: the commit that trained the model and the one that exported it."""
    trained = summary.get("git_commit", "unknown")
    return f"trained at commit `{trained}`, exported at commit `{git_commit(Path(__file__).parent)}`"
