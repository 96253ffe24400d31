"""The ViT's export: the final sparse model of an AC/DC run as a timm folder with a model card.

`model.safetensors` and timm's `config.json`, whose `pretrained_cfg` holds the run's eval
preprocessing (input size, resize interpolation, centre-crop fraction, normalisation): loaded
the timm way, `timm.create_model("local-dir:" + out, pretrained=True)`, then
`timm.data.resolve_data_config(model=model)` and `timm.data.create_transform(**config)`,
it scores the run's top-1. The final checkpoint of a completed run is the final compressed
phase's sparse model: exported as it is, in float32, pruned entries exact zeros.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

import pruning
from horst_sparse.training.config import RunError
from horst_sparse.training.export import RunFolder, commits, optimizer_line, plain_mode
from horst_sparse.vit.config import prunable_set
from horst_sparse.vit.model import build_model

# Fields of timm's pretrained_cfg that describe the published weights of the architecture the model
# was built from (e.g. `tag: augreg_in21k_ft_in1k`, `license: apache-2.0`), not this run's: the export drops them.
TIMM_WEIGHTS_FIELDS = ("tag", "license", "description", "origin_url", "paper_name", "paper_ids", "notes")


def eval_data_config(aug: Mapping[str, Any], *, img_size: int) -> dict[str, Any]:
    """timm's data config of the recipe's eval transform (`horst_sparse.vit.data.build_transforms`:
    `create_transform(img_size, interpolation=aug.interpolation, crop_pct=aug.crop_pct)`,
    timm's default centre crop and ImageNet normalisation)."""
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    return {
        "input_size": (3, img_size, img_size),
        "interpolation": aug["interpolation"],
        "crop_pct": aug["crop_pct"],
        "crop_mode": "center",
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
    }


def export_vit(model: torch.nn.Module, cfg, out: str | Path, *, num_classes: int, summary: dict) -> dict[str, Any]:
    """Save the timm `model` (already sparse) as `out/model.safetensors` with timm's
    `config.json` and a model card."""
    from safetensors.torch import save_file
    from timm.models._hub import save_config_for_hf

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    m = cfg.model
    model_args = {
        "img_size": m.img_size,
        "patch_size": m.patch_size,
        "embed_dim": m.embed_dim,
        "depth": m.depth,
        "num_heads": m.num_heads,
    }
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    plain_mode([out / "model.safetensors"])  # safetensors writes it 0600, unlike every other file here
    data_config = eval_data_config(cfg.aug, img_size=m.img_size)
    save_config_for_hf(model, str(out / "config.json"), model_args=model_args, data_config=data_config)
    config = json.loads((out / "config.json").read_text())
    config["pretrained_cfg"] = {k: v for k, v in config["pretrained_cfg"].items() if k not in TIMM_WEIGHTS_FIELDS}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = prunable_set(model, cfg.acdc)
    facts = {
        "dir": str(out),
        "file": str(out / "model.safetensors"),
        "format": "timm VisionTransformer, safetensors",
        "timm_name": m.timm_name,
        "num_classes": num_classes,
        "model_args": model_args,
        "data_config": data_config,
        "pattern": cfg.acdc.get("pattern", pruning.UNSTRUCTURED),
        "sparsity": cfg.acdc.sparsity,
        "measured_sparsity": pruning.sparsity_stats(weights)["overall"],
        "top1": summary.get("top1"),
        "top5": summary.get("top5"),
    }
    (out / "README.md").write_text(_vit_card(cfg, facts, summary))
    return facts


def export_run(
    run: RunFolder,
    out: str | Path,
    *,
    sparsity: float | None = None,
    method: str = "magnitude",
    pattern: str = "unstructured",
) -> dict[str, Any]:
    """Export the final sparse model of a completed ViT run (its summary written)."""
    run_dir, state, cfg, summary = run.path, run.state, run.cfg, run.summary
    if (method, pattern) != ("magnitude", "unstructured"):
        raise RunError(
            f"{run_dir} is a ViT run: its export is the final AC/DC model as trained; --method and --pattern "
            "prune GPT-2 runs only"
        )
    if sparsity is not None:
        raise RunError("--sparsity applies to GPT-2 only: a ViT run's final model is already sparse (acdc.sparsity)")
    if not summary or state.get("epoch") != cfg.train.epochs:
        raise RunError(
            f"{run_dir} is not a completed ViT run (no summary.json or its last checkpoint is not the final "
            "epoch's): its final compressed phase is the model to export; finish the run first"
        )
    num_classes = state["model"]["head.weight"].shape[0]
    in_chans = state["model"]["patch_embed.proj.weight"].shape[1]  # the data's: 1 for MNIST-1D
    model = build_model(cfg.model, num_classes=num_classes, in_chans=in_chans)
    model.load_state_dict(state["model"])
    model.eval()
    return export_vit(model, cfg, out, num_classes=num_classes, summary=summary)


# ---- model card ------------------------------------------------------------------------------


def _vit_card(cfg, facts: dict, summary: dict) -> str:
    data = summary.get("data", {})
    args = ", ".join(f"{k}={v}" for k, v in facts["model_args"].items())
    top1 = f"{facts['top1']:.4f}" if facts["top1"] is not None else "?"
    top5 = f"{facts['top5']:.4f}" if facts["top5"] is not None else "?"
    return f"""---
library_name: timm
tags: [image-classification, vision-transformer, sparse, acdc]
---

# ViT ({cfg.model.name}), AC/DC at {facts["sparsity"]:.0%}, {facts["pattern"]}

A timm VisionTransformer trained with the HORST repository's AC/DC pipeline (`train_vit.py`);
the final compressed phase's sparse model.

| | |
|---|---|
| optimizer | {optimizer_line(cfg)} |
| model | timm `{facts["timm_name"]}` with {args}, {facts["num_classes"]} classes |
| training data | {cfg.data.name} ({data.get("train_images", "?")} training images), {cfg.train.epochs} epochs, seed {cfg.seed} |
| sparsity | AC/DC target {facts["sparsity"]}, pattern {facts["pattern"]}; measured {facts["measured_sparsity"]:.4f} of the block matrices (qkv, proj, fc1, fc2; exact zeros) |
| validation | top-1 {top1}, top-5 {top5} on {data.get("val_images", "?")} validation images (the run's final evaluation) |
| provenance | {commits(summary)} |

```python
import timm
model = timm.create_model("local-dir:PATH", pretrained=True).eval()
transform = timm.data.create_transform(**timm.data.resolve_data_config(model=model))  # the run's eval preprocessing
```

The preprocessing in config.json is the recipe's eval transform: resize to
{facts["data_config"]["input_size"][-1]} / {facts["data_config"]["crop_pct"]} ({facts["data_config"]["interpolation"]}), centre crop {facts["data_config"]["input_size"][-1]}, ImageNet mean/std.
"""
