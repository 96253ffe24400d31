"""Export a run's model in a format other tools load, with a model card (README.md).

    python scripts/export.py outputs/gpt2/RUN --sparsity 0.5 --to hf exported/gpt2-50
    python scripts/export.py outputs/gpt2/RUN --method wanda --pattern 2:4 --to hf exported/gpt2-wanda-24
    python scripts/export.py outputs/vit/RUN --to timm exported/deit

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

Each pipeline's export is its own (`training/gpt2/export.py`, `training/vit/export.py`) over
the shared run-folder reader (`training/export.py`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pruning  # noqa: E402
from training.config import RunError  # noqa: E402
from training.export import read_run  # noqa: E402
from training.gpt2 import export as gpt2_export  # noqa: E402
from training.vit import export as vit_export  # noqa: E402

FORMATS = {"hf": "gpt2", "timm": "vit"}  # --to: the pipeline whose runs it takes


def export_run(run_dir: str | Path, out: str | Path, *, to: str, sparsity: float | None = None,
               method: str = "magnitude", pattern: str = pruning.UNSTRUCTURED) -> dict:  # fmt: skip
    """Export the run folder's model in the `to` format (the pipeline's own export)."""
    run = read_run(run_dir)
    expected = {pipeline: fmt for fmt, pipeline in FORMATS.items()}.get(run.pipeline)
    if to != expected:
        raise RunError(f"{run_dir} is a {run.pipeline} run: export it with --to {expected}")
    if run.pipeline == "vit":
        return vit_export.export_run(run, out, sparsity=sparsity)
    return gpt2_export.export_run(run, out, sparsity=sparsity, method=method, pattern=pattern)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a run folder (config.yaml, ckpt_*.pt, summary.json)")
    parser.add_argument("out", help="the folder to write")
    parser.add_argument("--to", required=True, choices=tuple(FORMATS), help="hf: GPT-2 runs; timm: ViT runs")
    parser.add_argument("--sparsity", type=float, default=None, help="GPT-2, unstructured: the fraction to prune")
    parser.add_argument("--method", default="magnitude", choices=("magnitude", "wanda"), help="GPT-2 (default magnitude)")
    parser.add_argument("--pattern", default="unstructured", help="GPT-2: unstructured (default) or n:m such as 2:4")
    args = parser.parse_args(argv)
    try:
        facts = export_run(args.run_dir, args.out, to=args.to, sparsity=args.sparsity, method=args.method,
                           pattern=args.pattern)  # fmt: skip
    except (RunError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    metric = f"perplexity {facts['ppl']:.2f}" if "ppl" in facts else f"top-1 {facts['top1']:.4f}"
    print(f"wrote {facts['dir']} ({facts['format']}; measured sparsity {facts['measured_sparsity']:.4f}, {metric})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
