"""What every pipeline's export shares, knowing no pipeline: reading a run folder (its latest
checkpoint, config and summary), the model card's common lines, and `horst-sparse export`.

Each pipeline writes its own format over this (its `Pipeline.export`): `horst_sparse.gpt2.export`
a `transformers` folder, `horst_sparse.vit.export` a timm folder; `horst-sparse export` takes the run's
pipeline from its config and checks `--to` against it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from horst_sparse.training.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from horst_sparse.training.config import RunError
from horst_sparse.training.run_log import SUMMARY_FILE, git_commit


@dataclass
class RunFolder:
    """A run folder as an export reads it."""

    path: Path
    state: dict[str, Any]  # the latest checkpoint
    cfg: DictConfig  # the config it was written with
    summary: dict[str, Any]  # summary.json; {} for an unfinished run

    @property
    def pipeline(self) -> str:
        """The pipeline that ran it (its config's `pipeline` key)."""
        return str(self.cfg.get("pipeline"))


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


def umask() -> int:
    """The process's umask, read without setting it (os.umask sets one to read it: for that moment
    every file another thread creates would get the wrong mode)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # no /proc (not Linux): the one way there is
    os.umask(mask)
    return mask


def plain_mode(paths: Iterable[str | Path]) -> None:
    """Give each file the mode that `open(path, "w")` gives a new file: 0666 less the umask (0644
    under the usual 022). safetensors writes its file 0600 (a private temporary file, renamed), so
    the model would otherwise be the one file of an export that the machine's other users (a
    shared cluster's, a container's other uid) cannot read."""
    mode = 0o666 & ~umask()
    for path in paths:
        os.chmod(path, mode)


def export_run(run_dir: str | Path, out: str | Path, *, to: str, force: bool = False, **options: Any) -> dict:
    """Export the run folder's model in the `to` format (its pipeline's own export). A folder `out`
    that holds files is refused unless `force` (then its files of the same names are replaced)."""
    from horst_sparse.pipeline import UnknownPipeline, get

    if not force and Path(out).exists() and (not Path(out).is_dir() or any(Path(out).iterdir())):
        raise RunError(f"{out} exists and is not empty; choose a new folder, or pass --force to write over it")
    run = read_run(run_dir)
    try:
        pipeline = get(run.pipeline)
    except UnknownPipeline as error:
        raise RunError(f"{run_dir}: {error}") from None
    if pipeline.export is None:
        raise RunError(f"{run_dir} is a {pipeline.name} run, and that pipeline has no export")
    if to != pipeline.export.format:
        raise RunError(f"{run_dir} is a {pipeline.name} run: export it with --to {pipeline.export.format}")
    return pipeline.export.run(run, out, **options)


def main(argv: list[str] | None = None) -> int:
    """`horst-sparse export`: export a run's model in a format other tools load, with a model card (README.md).

        horst-sparse export outputs/gpt2/RUN --sparsity 0.5 --to hf exported/gpt2-50
        horst-sparse export outputs/gpt2/RUN --method wanda --pattern 2:4 --to hf exported/gpt2-wanda-24
        horst-sparse export outputs/vit/RUN --to timm exported/deit

    GPT-2 (`--to hf`): the trained model from the run's last checkpoint, pruned one-shot as the
    pipeline prunes (`--method magnitude|wanda`, `--pattern unstructured|n:m`, `--sparsity` for
    unstructured), saved with `save_pretrained` (safetensors) and GPT-2's tokenizer files:
    `GPT2LMHeadModel.from_pretrained(OUT)`. Its perplexity in the card is the run's own when the
    run evaluated that setting (summary.json), else it is evaluated on the run's validation
    tokens (the run's data.dir must still exist; Wanda also reads its training tokens).

    ViT (`--to timm`): the final checkpoint of a completed AC/DC run, the final compressed
    phase's sparse model, as it is: OUT/model.safetensors and timm's config.json:
    `timm.create_model("local-dir:OUT", pretrained=True)`; its config.json carries the run's eval
    preprocessing, so `timm.data.resolve_data_config(model=model)` + `create_transform` give the
    run's top-1. `--sparsity` does not apply.

    OUT must be a new or empty folder; `--force` writes into one that holds files.

    Each pipeline's export is its own (`horst_sparse/gpt2/export.py`, `horst_sparse/vit/export.py`) over
    the shared run-folder reader (`horst_sparse/training/export.py`).
    """
    import argparse
    import sys

    from horst_sparse.pipeline import every

    formats = {p.export.format: p.name for p in every() if p.export}
    parser = argparse.ArgumentParser(
        prog="horst-sparse export",
        description=(main.__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(main.__doc__ or "").split("\n\n", 1)[1],
    )
    parser.add_argument("run_dir", help="a run folder (config.yaml, ckpt_*.pt, summary.json)")
    parser.add_argument("out", help="the folder to write")
    parser.add_argument(
        "--to",
        required=True,
        choices=tuple(formats),
        help="; ".join(f"{fmt}: {name} runs" for fmt, name in formats.items()),
    )
    parser.add_argument("--sparsity", type=float, default=None, help="GPT-2, unstructured: the fraction to prune")
    parser.add_argument(
        "--method", default="magnitude", choices=("magnitude", "wanda"), help="GPT-2 (default magnitude)"
    )
    parser.add_argument("--pattern", default="unstructured", help="GPT-2: unstructured (default) or n:m such as 2:4")
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into OUT even if it holds files (those of the same names are replaced)",
    )
    args = parser.parse_args(argv)
    try:
        facts = export_run(
            args.run_dir,
            args.out,
            to=args.to,
            force=args.force,
            sparsity=args.sparsity,
            method=args.method,
            pattern=args.pattern,
        )
    except (RunError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    metric = f"perplexity {facts['ppl']:.2f}" if "ppl" in facts else f"top-1 {facts['top1']:.4f}"
    print(f"wrote {facts['dir']} ({facts['format']}; measured sparsity {facts['measured_sparsity']:.4f}, {metric})")
    return 0
