"""Train a ViT/DeiT under the AC/DC schedule; report the final sparse model's accuracy.

`run(cfg, run_dir)` is the whole pipeline, top to bottom; `train_vit.py` is its Hydra entry
point. AC/DC (docs/design.md §3.3): dense warm-up, then compressed phases (global magnitude
masks over the block matrices, recomputed at the start of each, held fixed) alternating with
decompressed ones (pruned weights restart from 0, the optimizer's first moment is reset),
ending with a long compressed phase whose sparse model is the result. Every epoch ends with
top-1/top-5 on the validation set, tagged with its phase. The scaffolding around the loop
(start-up, resume, checkpoints, preemption, the non-finite guard) is `horst_sparse.training.runner.Run`;
a preempted run checkpoints after its current batch and continues from the next one.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel

import pruning
from horst_sparse.training.checkpoint import CheckpointError
from horst_sparse.training.config import ConfigError, RunError
from horst_sparse.training.distributed import all_reduce_mean, gradient_sync
from horst_sparse.training.engine import optimizer_overrides, use_engine_
from horst_sparse.training.env import autocast, image_batch_bytes, seed_rngs, shared_memory_problem
from horst_sparse.training.optim import build_optimizer
from horst_sparse.training.run_log import RunLogger, optimizer_label, progress_bar
from horst_sparse.training.runner import Run
from horst_sparse.training.schedule import build_lr_scheduler
from horst_sparse.vit.config import acdc_schedule, prunable_set, scaled_lr
from horst_sparse.vit.data import (
    PREFETCH_FACTOR,
    ImageData,
    TrainLoader,
    build_datasets,
    build_mixup,
    epoch_seed,
    eval_loader,
    skipped_images,
)
from horst_sparse.vit.model import build_model, evaluate

# Besides horst_sparse.training.no_effect.NO_EFFECT, a continued run may change which split its final model is
# measured on (read only after training): what is measured, not what is trained.
MAY_CHANGE_ON_RESUME = ("eval_split",)


PHASE_IDS = {"dense": 0, "compressed": 1, "decompressed": 2}  # `val/phase_id`: W&B charts numbers


def log_weight_histogram(log: RunLogger, weights: dict, *, bins: int, step: int, epoch: int) -> None:
    """log10|w| of the non-zero prunable weights: JSONL (counts and edges) and a W&B histogram."""
    counts, edges = pruning.magnitude_histogram(weights, bins=bins, log=True)
    record = {"epoch": epoch, "weights/log10_abs_counts": counts.tolist(), "weights/log10_abs_edges": edges.tolist()}
    log.log(record, step=step, to_wandb=False)
    log.log_histogram("weights/log10_abs", counts, edges, step=step)


def check_resume_position(state: dict, path: Path, *, world_size: int, steps_per_epoch: int, train_images: int) -> None:
    """A checkpoint taken mid-epoch continues that epoch's batches: same data and processes."""
    batch = state.get("batch", 0)
    if batch and state["world_size"] != world_size:
        raise CheckpointError(
            f"{path} was taken mid-epoch by {state['world_size']} processes, this run has {world_size}; "
            "rerun with as many, or start a new run folder (hydra.run.dir=...) or resume=never"
        )
    if state["step"] != state["epoch"] * steps_per_epoch + batch:
        raise CheckpointError(
            f"{path} was taken after {state['step']} updates, at batch {batch} of epoch {state['epoch']}, but "
            f"this run has {steps_per_epoch} updates per epoch ({train_images} training images): resume with "
            "the same training set, or start a new run folder (hydra.run.dir=...) or resume=never"
        )


def train_step(
    train_model: torch.nn.Module,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    sparsifier: pruning.Sparsifier,
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    targets: torch.Tensor,
    *,
    step: int,
    accum_steps: int,
    dtype: torch.dtype | None,
    grad_clip: float,
    watch_loss: Callable[..., None],
    epoch_loss: torch.Tensor,
) -> torch.Tensor:
    """Update `step` + 1 on this process's (mixed) batch: forward, loss and backward over
    `accum_steps` slices of it, the gradient-norm clip, the optimizer's step between the
    sparsifier's masks, and the LR schedule's step. `watch_loss` notes the update's loss
    (`Run.watch_loss`) and `epoch_loss` (float64, on the device) adds it. Returns that loss (the
    mean over processes), on the device: nothing in an update waits for the device
    (tests/test_no_host_read.py)."""
    device = images.device
    # Gradient accumulation: train.accum_steps forward/backward passes over slices of the batch,
    # each loss weighted by its slice's share, so the gradient is the whole batch's mean; DDP
    # all-reduces after the last pass only.
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), device=device)
    micro_batches = list(zip(images.chunk(accum_steps), targets.chunk(accum_steps)))
    for i, (micro_images, micro_targets) in enumerate(micro_batches):
        with gradient_sync(train_model, i == len(micro_batches) - 1):
            with autocast(device, dtype):
                output = train_model(micro_images)
            loss = criterion(output.float(), micro_targets) * (len(micro_images) / len(images))
            loss.backward()
        loss_sum += loss.detach()
    step_loss = all_reduce_mean(loss_sum)
    watch_loss(step_loss, step=step + 1)  # read at log intervals and before checkpoints
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    sparsifier.mask_grads_()  # pruned weights get no update in a compressed phase ...
    optimizer.step()
    sparsifier.apply_masks_()  # ... and stay exactly 0 despite momentum and weight decay
    scheduler.step_update(step + 1)
    epoch_loss += step_loss.double()
    return step_loss


def summarize(
    cfg: DictConfig,
    *,
    data: ImageData,
    skipped_log: Path,
    model: torch.nn.Module,
    lr: float,
    schedule: pruning.ACDCSchedule,
    history: list[dict],
    final: dict,
    eval_images: int,
    sparsity: dict,
    step: int,
    final_train_loss: float,
    wall_time_s: float,
    world_size: int,
    device: torch.device,
    dtype: torch.dtype,
) -> dict:
    """The run's summary.json: the settings that identify it, the final sparse model's accuracy
    (`final`, on `cfg.eval_split`) and `sparsity`, and every epoch's `history`."""
    t, acdc = cfg.train, cfg.acdc
    return {
        "pipeline": "vit",
        "model": {
            "preset": cfg.model.name,
            **OmegaConf.to_container(cfg.model, resolve=True),
            "num_classes": len(data.classes),
            "parameters": sum(p.numel() for p in model.parameters()),
            "prunable_parameters": sparsity["numel"],
        },
        "optimizer": {
            **OmegaConf.to_container(cfg.optimizer, resolve=True),
            "lr": lr,
            "base_lr": t.base_lr,
            "base_batch_size": t.base_batch_size,
            "min_lr": t.min_lr,
            "warmup_lr": t.warmup_lr,
            "warmup_epochs": t.warmup_epochs,
            "schedule": "linear warm-up, then cosine, per update",
        },
        "data": {
            "name": cfg.data.name,
            "root": cfg.data.root,
            "train_images": len(data.train),
            "val_images": len(data.val),
            **({"test_images": len(data.test)} if data.test is not None else {}),
            "splits": data.sources,
            "num_classes": len(data.classes),
            "skipped_images": skipped_images(skipped_log),
        },
        "acdc": {
            **OmegaConf.to_container(acdc, resolve=True),
            "prune_epochs": list(schedule.prune_epochs),
            "restore_epochs": list(schedule.restore_epochs),
        },
        "train": {
            "epochs": t.epochs,
            "steps": step,
            "batch_size": t.batch_size,
            "world_size": world_size,
            "device": str(device),
            "precision": str(dtype).removeprefix("torch."),
            "final_train_loss": final_train_loss,
            "wall_time_s": wall_time_s,
        },
        "seed": cfg.seed,
        "target_sparsity": acdc.sparsity,
        "measured_sparsity": sparsity["overall"],
        "eval_split": cfg.eval_split,
        "top1": final["top1"],
        "top5": final["top5"],
        "final_phase": final["phase"],
        "accuracy_unit": f"fraction of the {eval_images} {cfg.eval_split} images",
        "per_layer_sparsity": sparsity["per_layer"],
        "epochs": history,
    }


def run(cfg: DictConfig, *, run_dir: str | Path) -> dict:
    """Train under AC/DC as `cfg` says, writing into `run_dir`; returns the summary."""
    r = Run(
        cfg,
        run_dir,
        title=f"{cfg.model.name} {optimizer_label(cfg.optimizer)} s{cfg.acdc.sparsity:g} seed{cfg.seed}",
        tags=[cfg.optimizer.name, cfg.model.name, f"sparsity={cfg.acdc.sparsity:g}", cfg.data.name],
        epoch_metrics=("val/*", "sparsity/*", "train/epoch_loss"),
    )
    dist, device, t, acdc = r.dist, r.device, cfg.train, cfg.acdc
    channels_last = device.type == "cuda"
    cpu_fast = cfg.engine == "fast" and device.type == "cpu"

    # ---- data: the same timm pipeline for ImageNet and the digits; test only if reported ------
    # workers hand their batches (at most 3 channels) over through /dev/shm: 64 MB in Docker
    if problem := shared_memory_problem(
        image_batch_bytes(max(t.batch_size // dist.world_size, t.eval_batch_size), 3, cfg.model.img_size),
        workers=cfg.data.num_workers,
        prefetch=PREFETCH_FACTOR,
        processes=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),  # torchrun's ranks on this node
    ):
        raise RunError(problem)
    skipped_log = r.run_dir / "skipped_images.txt"  # data.skip_corrupt: the unreadable images met
    data = build_datasets(
        cfg.data, cfg.aug, img_size=cfg.model.img_size, eval_split=cfg.eval_split, skipped_log=skipped_log
    )
    train_set, val_set, classes = data.train, data.val, data.classes
    if data.minival is not None and r.is_main:  # the fixed list of training images held out for validation
        (r.run_dir / "minival.txt").write_text("".join(f"{path}\n" for path in data.minival))
    mixup, criterion = build_mixup(cfg.aug, num_classes=len(classes))
    pin_memory = cfg.data.pin_memory and device.type == "cuda"
    train_batches = TrainLoader(
        train_set,
        batch_size=t.batch_size // dist.world_size,
        seed=cfg.seed,
        rank=dist.rank,
        world_size=dist.world_size,
        repeated_aug=cfg.data.repeated_aug,
        num_workers=cfg.data.num_workers,
        pin_memory=pin_memory,
        in_memory=cfg.engine == "fast",
    )
    val_batches = eval_loader(
        val_set,
        batch_size=t.eval_batch_size,
        rank=dist.rank,
        world_size=dist.world_size,
        num_workers=cfg.data.num_workers,
        pin_memory=pin_memory,
        in_memory=cfg.engine == "fast",
    )
    steps_per_epoch = len(train_batches)
    if steps_per_epoch == 0:
        raise ConfigError(f"train.batch_size={t.batch_size} exceeds the {len(train_set)} training images; lower it")

    # ---- model, prunable set, AC/DC, optimizer, LR schedule ----------------------------------
    model = build_model(cfg.model, num_classes=len(classes), in_chans=data.in_chans).to(device)
    use_engine_(model, cfg.engine)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    prunable = prunable_set(model, acdc)
    sparsifier = pruning.Sparsifier(prunable)
    schedule = acdc_schedule(acdc, epochs=t.epochs)
    lr = scaled_lr(t)
    optimizer = build_optimizer(
        cfg.optimizer, model, lr=lr, prunable_names=prunable.keys(), **optimizer_overrides(cfg.engine)
    )
    scheduler = build_lr_scheduler(
        optimizer,
        total_steps=t.epochs * steps_per_epoch,
        warmup_steps=t.warmup_epochs * steps_per_epoch,
        min_lr=t.min_lr,
        warmup_lr=t.warmup_lr,
    )

    check = functools.partial(
        check_resume_position, world_size=dist.world_size, steps_per_epoch=steps_per_epoch, train_images=len(train_set)
    )

    def position(state: dict) -> str:
        epoch, batch = state["epoch"], state.get("batch", 0)
        at = f"epoch {epoch}, batch {batch}" if batch else f"epoch {epoch}"
        return f"{at} ({schedule.phase(min(epoch, t.epochs - 1))} phase)"

    state = r.restore(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        lr=lr,
        may_change=MAY_CHANGE_ON_RESUME,
        check=check,
        position=position,
    )
    # `batch`: batches of `epoch` done; `epoch_loss`: the sum of their (mean over processes) losses.
    epoch, batch, step, epoch_loss, history = 0, 0, 0, 0.0, []
    if state:
        sparsifier.load_state_dict(state["masks"])  # the phase's masks, if it is a compressed one
        epoch, step, history = state["epoch"], state["step"], state["history"]
        # Mid-epoch after a preemption; per-epoch checkpoints (older ones have no `batch`) are at batch 0.
        batch, epoch_loss = state.get("batch", 0), state.get("epoch_loss", 0.0)

    forward_model = torch.compile(model) if cfg.compile else model
    train_model = forward_model
    if dist.enabled:
        train_model = DistributedDataParallel(
            forward_model, device_ids=[device.index] if device.type == "cuda" else None
        )

    # Summed on the device in float64 (as the float sum of each update's loss): no host sync per step.
    epoch_loss = torch.tensor(epoch_loss, dtype=torch.float64, device=device)

    def extra_state() -> dict:
        return dict(
            epoch=epoch,
            batch=batch,
            epoch_loss=epoch_loss.item(),
            world_size=dist.world_size,
            masks=sparsifier.state_dict(),
            history=history,
        )

    # ---- training ------------------------------------------------------------------------------
    bar = progress_bar(total=t.epochs * steps_per_epoch, initial=step, disable=not r.is_main)
    step_loss = torch.full((), float("nan"), device=device)  # the last update's loss, on the device
    while epoch < t.epochs:
        phase, action = schedule.phase(epoch), schedule.action(epoch)
        if batch == 0:  # at the epoch's start (resumed mid-epoch, the checkpoint holds the phase's masks and moments)
            if action == "prune":
                sparsifier.prune(acdc.sparsity, scope=acdc.scope, pattern=acdc.pattern)
            elif action == "restore":
                sparsifier.restore()
                pruning.reset_optimizer_moments(optimizer, prunable, first=True, second=acdc.reset_second_moment)
        bar.set_description(f"epoch {epoch} {phase}")
        model.train()
        tick, ticked_step = time.time(), step
        # Resumed mid-epoch: from the next batch on, without loading the done ones (TrainLoader).
        for images, targets in train_batches.epoch(epoch, start=batch):
            # Mixing and drop path draw from (seed, epoch, rank, batch): a resumed run replays them.
            seed_rngs(epoch_seed(cfg.seed, epoch, dist.rank + 1, batch), cpu_only=cpu_fast)
            images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            if mixup is not None:  # over the process's whole batch: accumulation does not change the mixing
                images, targets = mixup(images, targets)
            lr_now = optimizer.param_groups[0]["lr"]
            step_loss = train_step(
                train_model,
                model,
                optimizer,
                scheduler,
                sparsifier,
                criterion,
                images,
                targets,
                step=step,
                accum_steps=t.accum_steps,
                dtype=r.dtype,
                grad_clip=t.grad_clip,
                watch_loss=r.watch_loss,
                epoch_loss=epoch_loss,
            )
            step += 1
            batch += 1
            bar.update()

            if t.log_interval and step % t.log_interval == 0:
                r.check_losses()
                train_loss = step_loss.item()
                images_per_s = t.batch_size * (step - ticked_step) / (time.time() - tick)
                tick, ticked_step = time.time(), step
                r.log.log({"train/loss": train_loss, "train/lr": lr_now, "perf/images_per_s": images_per_s}, step=step)
                bar.set_postfix(
                    loss=f"{train_loss:.3f}", lr=f"{lr_now:.2e}", img_s=f"{images_per_s:.0f}", refresh=False
                )
            # Every process polls at the same batch (a collective under DDP: not every update there).
            if (not dist.enabled or step % max(t.log_interval, 1) == 0) and r.preempted():
                r.exit_for_requeue(step=step, bar=bar, **extra_state())  # the requeued run continues at the next batch

        r.check_losses()

        # ---- end of epoch: validation of the model as it is (sparse in a compressed phase) --------
        val = evaluate(forward_model, val_batches, device=device, dtype=r.dtype, channels_last=channels_last)
        sparsity = pruning.sparsity_stats(prunable)
        record = {
            "epoch": epoch,
            "phase": phase,
            "top1": val["top1"],
            "top5": val["top5"],
            "val_loss": val["loss"],
            "train_loss": epoch_loss.item() / steps_per_epoch,
            "sparsity": sparsity["overall"],
        }
        history.append(record)
        r.log.log(
            {
                "epoch": epoch,
                "val/phase": phase,  # the JSONL file's; W&B charts the number
                "val/phase_id": PHASE_IDS[phase],
                **{f"val/{k}": record[k] for k in ("top1", "top5", "val_loss")},
                "train/epoch_loss": record["train_loss"],
                "sparsity/overall": sparsity["overall"],
                **{f"sparsity/{name}": s for name, s in sparsity["per_layer"].items()},
            },
            step=step,
        )
        if r.is_main:
            log_weight_histogram(r.log, prunable, bins=acdc.histogram_bins, step=step, epoch=epoch)
            bar.write(
                f"epoch {epoch:3d} {phase:>12}: train loss {record['train_loss']:.4f}  val top-1 {val['top1']:.4f}  "
                f"top-5 {val['top5']:.4f}  sparsity {sparsity['overall']:.4f}"
            )
        epoch, batch = epoch + 1, 0
        epoch_loss.zero_()
        if (t.checkpoint_interval and epoch % t.checkpoint_interval == 0) or epoch == t.epochs:
            r.save(step=step, **extra_state())
    bar.close()

    # ---- the result: the final compressed phase's sparse model, on `eval_split` ----------------
    r.log.log_table("val/epochs", history, step=step, plot=("epoch", "top1", "top-1 by epoch (phase in the table)"))
    final = {"phase": history[-1]["phase"], **{k: history[-1][k] for k in ("top1", "top5")}}
    eval_set = data.split(cfg.eval_split)
    if cfg.eval_split == "test":
        test_batches = eval_loader(
            eval_set,
            batch_size=t.eval_batch_size,
            rank=dist.rank,
            world_size=dist.world_size,
            num_workers=cfg.data.num_workers,
            pin_memory=pin_memory,
            in_memory=cfg.engine == "fast",
        )
        test = evaluate(forward_model, test_batches, device=device, dtype=r.dtype, channels_last=channels_last)
        final.update(top1=test["top1"], top5=test["top5"])
        r.log.log({"test/top1": test["top1"], "test/top5": test["top5"], "test/loss": test["loss"]}, step=step)
    sparsity = pruning.sparsity_stats(prunable)
    summary = r.finish(
        summarize(
            cfg,
            data=data,
            skipped_log=skipped_log,
            model=model,
            lr=lr,
            schedule=schedule,
            history=history,
            final=final,
            eval_images=len(eval_set),
            sparsity=sparsity,
            step=step,
            final_train_loss=step_loss.item(),
            wall_time_s=r.elapsed_s,
            world_size=dist.world_size,
            device=device,
            dtype=r.dtype,
        )
    )
    if r.is_main:
        print(
            f"final sparse model ({cfg.model.name}: {summary['model']['parameters'] / 1e6:.2f}M parameters, "
            f"{summary['optimizer']['name']}, AC/DC at {acdc.sparsity:.0%}; measured sparsity "
            f"{sparsity['overall']:.4f} of {sparsity['numel']:,} prunable weights): top-1 {final['top1']:.4f}, "
            f"top-5 {final['top5']:.4f} on {len(eval_set)} {cfg.eval_split} images"
        )
        print(f"run folder: {r.run_dir}")
    return summary
