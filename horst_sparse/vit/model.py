"""The ViT model, a randomly initialised timm VisionTransformer (DeiT-tiny/small/base,
docs/design.md §4, and small presets for the CPU, `configs/model/{deit,vit}_*.yaml`), and its
top-1/top-5 evaluation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from horst_sparse.training.distributed import all_reduce_sum
from horst_sparse.training.env import autocast


def pair(size) -> tuple[int, int]:
    """`(height, width)` of a square size `n` or a `[height, width]` list (MNIST-1D: [1, 40])."""
    return (size, size) if isinstance(size, int) else tuple(size)


def build_model(model_cfg: DictConfig, *, num_classes: int, in_chans: int = 3) -> torch.nn.Module:
    """A randomly initialised timm VisionTransformer with the preset's shape; `in_chans`
    is the data's (3 for images, 1 for MNIST-1D)."""
    import timm

    return timm.create_model(
        model_cfg.timm_name,
        pretrained=False,
        num_classes=num_classes,
        in_chans=in_chans,
        img_size=pair(model_cfg.img_size),
        patch_size=pair(model_cfg.patch_size),
        embed_dim=model_cfg.embed_dim,
        depth=model_cfg.depth,
        num_heads=model_cfg.num_heads,
        drop_path_rate=model_cfg.drop_path,
    )


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    loader,
    *,
    device: torch.device,
    dtype: torch.dtype,
    channels_last: bool = False,
) -> dict[str, float]:
    """`{"top1", "top5", "loss", "images"}` over every validation image (all processes
    together); top-5 is top-min(5, classes). Accuracies are fractions in [0, 1]."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, top-1, top-5 hits, images
    for images, targets in loader:
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with autocast(device, dtype):
            logits = model(images)
        logits = logits.float()
        hits = logits.topk(min(5, logits.shape[1]), dim=1).indices == targets[:, None]
        totals[:3] += torch.stack(
            [
                F.cross_entropy(logits, targets, reduction="sum").double(),
                hits[:, 0].sum().double(),
                hits.any(dim=1).sum().double(),
            ]
        )
        totals[3] += len(targets)  # a number the host knows: no copy to the device
    all_reduce_sum(totals)
    model.train(was_training)
    loss_sum, top1, top5, count = totals.tolist()
    return {"top1": top1 / count, "top5": top5 / count, "loss": loss_sum / count, "images": int(count)}
