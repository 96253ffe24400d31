"""Train a ViT/DeiT under the AC/DC schedule with AdamW, HAM or HORST; report the sparse model.

    python train_vit.py                                         # embedded default (CPU, ~1 min)
    python train_vit.py optimizer=adamw acdc.sparsity=0.8
    python train_vit.py experiment=deit_small_acdc_s90 optimizer=horst data.root=/path/to/imagenet
    torchrun --nproc_per_node=8 train_vit.py experiment=deit_base_acdc_s90 optimizer=horst data.root=...

Config: configs/train_vit.yaml (schema in training/vit.py; recipes in configs/vit_recipe/).
AC/DC (DESIGN §3.3): dense warm-up, then compressed phases (global magnitude masks over the
block matrices, recomputed at the start of each, held fixed) alternating with decompressed
ones (pruned weights restart from 0, the optimizer's first moment is reset), ending with a
long compressed phase whose sparse model is the result. Every epoch ends with top-1/top-5 on
the validation set, tagged with its phase. The run folder holds config.yaml, metrics.jsonl,
checkpoints (masks and phase included) and summary.json. On SLURM's pre-timeout signal the
run checkpoints at the next batch and requeues (training/preemption.py); the requeued run
continues that epoch from the next batch, with no update lost or repeated.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

import pruning
from training.checkpoint import (
    CheckpointError,
    checkpoint_path,
    load_checkpoint,
    prune_old_checkpoints,
    resolve_resume,
    restore_training_state,
    save_checkpoint,
    training_state,
)
from training.config import ConfigError
from training.distributed import all_reduce_mean, barrier, init_distributed, shutdown_distributed
from training.env import autocast, autocast_dtype, device_type, seed_everything, seed_rngs, select_device
from training.guards import NON_FINITE_EXIT_CODE, NonFiniteLossError, check_finite_loss
from training.optim import build_optimizer
from training.preemption import PreemptionGuard
from training.run_log import RunLogger
from training.schedule import build_lr_scheduler
from training.vit import acdc_schedule, build_model, evaluate, register_configs, scaled_lr, validate
from training.vit_data import DataLayoutError, TrainLoader, build_datasets, build_mixup, build_transforms, epoch_seed, eval_loader

register_configs()

# A checkpoint written with other values of these cannot be continued by this config ...
RESUME_MUST_MATCH = ("model", "data.name", "train.epochs", "train.batch_size", "acdc", "optimizer.name")
# ... nor one taken mid-epoch with other values of these (or another number of processes):
# the rest of its epoch would be other images.
MID_EPOCH_MUST_MATCH = ("seed", "data.repeated_aug")


def check_resumable(state: dict, current: dict, path: Path, *, world_size: int) -> None:
    mid_epoch = state.get("batch", 0) > 0
    for key in RESUME_MUST_MATCH + (MID_EPOCH_MUST_MATCH if mid_epoch else ()):
        first, _, rest = key.partition(".")
        old, new = state["config"].get(first, {}), current[first]
        if rest:
            old, new = old.get(rest), new[rest]
        if old != new:
            raise CheckpointError(
                f"{path} was written with {key}={old}, this run has {new}; rerun with the same settings, "
                "or start a new run folder (hydra.run.dir=...) or resume=never"
            )
    if mid_epoch and state["world_size"] != world_size:
        raise CheckpointError(
            f"{path} was taken mid-epoch by {state['world_size']} processes, this run has {world_size}; rerun "
            "with as many, or start a new run folder (hydra.run.dir=...) or resume=never"
        )


def log_weight_histogram(log: RunLogger, weights: dict, *, bins: int, step: int, epoch: int) -> None:
    """log10|w| of the non-zero prunable weights: JSONL (counts and edges) and a W&B histogram."""
    counts, edges = pruning.magnitude_histogram(weights, bins=bins, log=True)
    log.log({"epoch": epoch, "weights/log10_abs_counts": counts.tolist(), "weights/log10_abs_edges": edges.tolist()}, step=step)
    wandb = sys.modules.get("wandb")  # imported by RunLogger unless W&B is disabled
    if log.enabled and wandb is not None and wandb.run is not None:
        wandb.run.log({"weights/log10_abs": wandb.Histogram(np_histogram=(counts.numpy(), edges.numpy()))}, step=step)


def run(cfg: DictConfig, *, run_dir: Path, model_preset: str | None = None) -> dict:
    """Train under AC/DC as `cfg` says, writing into `run_dir`; returns the summary."""
    started = time.time()
    dist = init_distributed(device_type(cfg.device))
    validate(cfg, model_choice=model_preset, world_size=dist.world_size)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    device = select_device(cfg.device, local_rank=dist.local_rank)
    dtype = autocast_dtype(cfg.precision, device)
    channels_last = device.type == "cuda"
    seed_everything(cfg.seed, deterministic=cfg.deterministic)
    if cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    t, acdc = cfg.train, cfg.acdc

    # ---- data: the same timm pipeline for ImageNet and the digits ----------------------------
    train_transform, eval_transform = build_transforms(cfg.aug, img_size=cfg.model.img_size)
    train_set, val_set, classes = build_datasets(cfg.data, train_transform=train_transform, eval_transform=eval_transform)
    mixup, criterion = build_mixup(cfg.aug, num_classes=len(classes))
    pin_memory = cfg.data.pin_memory and device.type == "cuda"
    train_batches = TrainLoader(
        train_set, batch_size=t.batch_size // dist.world_size, seed=cfg.seed, rank=dist.rank,
        world_size=dist.world_size, repeated_aug=cfg.data.repeated_aug, num_workers=cfg.data.num_workers,
        pin_memory=pin_memory,
    )  # fmt: skip
    val_batches = eval_loader(
        val_set, batch_size=t.eval_batch_size, rank=dist.rank, world_size=dist.world_size,
        num_workers=cfg.data.num_workers, pin_memory=pin_memory,
    )  # fmt: skip
    steps_per_epoch = len(train_batches)
    if steps_per_epoch == 0:
        raise ConfigError(f"train.batch_size={t.batch_size} exceeds the {len(train_set)} training images; lower it")

    # ---- model, prunable set, AC/DC, optimizer, LR schedule ----------------------------------
    model = build_model(cfg.model, num_classes=len(classes)).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    prunable = pruning.prunable_parameters(model, acdc.preset, patterns=list(acdc.patterns) or None)
    sparsifier = pruning.Sparsifier(prunable)
    schedule = acdc_schedule(acdc, epochs=t.epochs)
    lr = scaled_lr(t)
    optimizer = build_optimizer(cfg.optimizer, model, lr=lr, prunable_names=prunable.keys())
    scheduler = build_lr_scheduler(
        optimizer, total_steps=t.epochs * steps_per_epoch, warmup_steps=t.warmup_epochs * steps_per_epoch,
        min_lr=t.min_lr, warmup_lr=t.warmup_lr,
    )  # fmt: skip

    # `batch`: batches of `epoch` done; `epoch_loss`: the sum of their (mean over processes) losses.
    epoch, batch, step, epoch_loss, history, elapsed_before = 0, 0, 0, 0.0, [], 0.0
    resume_from = resolve_resume(cfg.resume, run_dir)
    if resume_from is not None:
        state = load_checkpoint(resume_from, map_location=device)
        check_resumable(state, resolved, resume_from, world_size=dist.world_size)
        state = restore_training_state(state, model=model, optimizer=optimizer, scheduler=scheduler)
        sparsifier.load_state_dict(state["masks"])  # the phase's masks, if it is a compressed one
        epoch, step, history, elapsed_before = state["epoch"], state["step"], state["history"], state["elapsed_s"]
        # Mid-epoch after a preemption; per-epoch checkpoints (older ones have no `batch`) are at batch 0.
        batch, epoch_loss = state.get("batch", 0), state.get("epoch_loss", 0.0)
        if step != epoch * steps_per_epoch + batch:
            raise CheckpointError(
                f"{resume_from} was taken after {step} updates, at batch {batch} of epoch {epoch}, but this run "
                f"has {steps_per_epoch} updates per epoch ({len(train_set)} training images): resume with the "
                "same training set, or start a new run folder (hydra.run.dir=...) or resume=never"
            )
        scheduler.step_update(step)
    log = RunLogger(
        run_dir, resolved, enabled=dist.is_main, project=cfg.logging.project, name=cfg.logging.name,
        group=cfg.logging.group, tags=list(cfg.logging.tags), mode=cfg.logging.mode,
        resume_step=step if resume_from is not None else None,
    )  # fmt: skip
    if resume_from is not None and dist.is_main:
        at = f"epoch {epoch}, batch {batch}" if batch else f"epoch {epoch}"
        tqdm.write(f"resumed from {resume_from} at {at} ({schedule.phase(min(epoch, t.epochs - 1))} phase)")

    forward_model = torch.compile(model) if cfg.compile else model
    train_model = forward_model
    if dist.enabled:
        train_model = DistributedDataParallel(forward_model, device_ids=[device.index] if device.type == "cuda" else None)

    def save() -> None:
        if dist.is_main:
            path = checkpoint_path(run_dir, step)
            log.checkpoint(path, step=step)  # before the file: a resume from it always finds its marker
            state = training_state(
                model=model, optimizer=optimizer, scheduler=scheduler, step=step, config=resolved,
                epoch=epoch, batch=batch, epoch_loss=epoch_loss, world_size=dist.world_size,
                masks=sparsifier.state_dict(), history=history, elapsed_s=elapsed_before + time.time() - started,
            )  # fmt: skip
            save_checkpoint(state, path)
            prune_old_checkpoints(run_dir, keep=t.keep_checkpoints)
        barrier()

    # ---- training ------------------------------------------------------------------------------
    bar = tqdm(total=t.epochs * steps_per_epoch, initial=step, disable=not dist.is_main, dynamic_ncols=True)
    train_loss = float("nan")
    preemption = PreemptionGuard()  # SLURM's pre-timeout signal: checkpoint, then requeue
    while epoch < t.epochs:
        phase, action = schedule.phase(epoch), schedule.action(epoch)
        if batch == 0:  # at the epoch's start (resumed mid-epoch, the checkpoint holds the phase's masks and moments)
            if action == "prune":
                sparsifier.prune(acdc.sparsity, scope=acdc.scope)
            elif action == "restore":
                sparsifier.restore()
                pruning.reset_optimizer_moments(optimizer, prunable, first=True, second=acdc.reset_second_moment)
        bar.set_description(f"epoch {epoch} {phase}")
        model.train()
        tick, ticked_step = time.time(), step
        # Resumed mid-epoch: from the next batch on, without loading the done ones (TrainLoader).
        for images, targets in train_batches.epoch(epoch, start=batch):
            # Mixing and drop path draw from (seed, epoch, rank, batch): a resumed run replays them.
            seed_rngs(epoch_seed(cfg.seed, epoch, dist.rank + 1, batch))
            images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            if mixup is not None:
                images, targets = mixup(images, targets)
            with autocast(device, dtype):
                output = train_model(images)
            loss = criterion(output.float(), targets)
            train_loss = all_reduce_mean(loss.detach().clone()).item()
            check_finite_loss(
                train_loss, step=step + 1, run_dir=run_dir, hint=f"train.base_lr (epoch {epoch}, {phase} phase)"
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if t.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            lr_now = optimizer.param_groups[0]["lr"]
            sparsifier.mask_grads_()  # pruned weights get no update in a compressed phase ...
            optimizer.step()
            sparsifier.apply_masks_()  # ... and stay exactly 0 despite momentum and weight decay
            step += 1
            batch += 1
            scheduler.step_update(step)
            epoch_loss += train_loss
            bar.update()

            if t.log_interval and step % t.log_interval == 0:
                images_per_s = t.batch_size * (step - ticked_step) / (time.time() - tick)
                tick, ticked_step = time.time(), step
                log.log({"train/loss": train_loss, "lr": lr_now, "images_per_s": images_per_s, "epoch": epoch}, step=step)
                bar.set_postfix(loss=f"{train_loss:.3f}", lr=f"{lr_now:.2e}", img_s=f"{images_per_s:.0f}", refresh=False)
            # Every process polls at the same batch (a collective under DDP).
            if preemption.requested():
                save()  # with `epoch` and `batch`: the requeued run continues from the next batch
                bar.close()
                log.close()
                preemption.requeue_or_exit()

        # ---- end of epoch: validation of the model as it is (sparse in a compressed phase) --------
        val = evaluate(forward_model, val_batches, device=device, dtype=dtype, channels_last=channels_last)
        sparsity = pruning.sparsity_stats(prunable)
        record = {
            "epoch": epoch,
            "phase": phase,
            "top1": val["top1"],
            "top5": val["top5"],
            "val_loss": val["loss"],
            "train_loss": epoch_loss / steps_per_epoch,
            "sparsity": sparsity["overall"],
        }
        history.append(record)
        log.log(
            {
                **{f"val/{k}": v for k, v in record.items()},
                **{f"sparsity/{name}": s for name, s in sparsity["per_layer"].items()},
            },
            step=step,
        )
        if dist.is_main:
            log_weight_histogram(log, prunable, bins=acdc.histogram_bins, step=step, epoch=epoch)
            bar.write(
                f"epoch {epoch:3d} {phase:>12}: train loss {record['train_loss']:.4f}  val top-1 {val['top1']:.4f}  "
                f"top-5 {val['top5']:.4f}  sparsity {sparsity['overall']:.4f}"
            )
        epoch, batch, epoch_loss = epoch + 1, 0, 0.0
        if (t.checkpoint_interval and epoch % t.checkpoint_interval == 0) or epoch == t.epochs:
            save()
    preemption.close()
    bar.close()

    # ---- the result: the final compressed phase's sparse model ---------------------------------
    final = history[-1]
    sparsity = pruning.sparsity_stats(prunable)
    opt = OmegaConf.to_container(cfg.optimizer, resolve=True)
    summary = log.summary(
        {
            "pipeline": "vit",
            "model": {
                "preset": model_preset,
                **OmegaConf.to_container(cfg.model, resolve=True),
                "num_classes": len(classes),
                "parameters": sum(p.numel() for p in model.parameters()),
                "prunable_parameters": sparsity["numel"],
            },
            "optimizer": {
                **opt,
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
                "train_images": len(train_set),
                "val_images": len(val_set),
                "num_classes": len(classes),
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
                "world_size": dist.world_size,
                "device": str(device),
                "precision": str(dtype).removeprefix("torch."),
                "final_train_loss": train_loss,
                "wall_time_s": elapsed_before + time.time() - started,
            },
            "seed": cfg.seed,
            "target_sparsity": acdc.sparsity,
            "measured_sparsity": sparsity["overall"],
            "top1": final["top1"],
            "top5": final["top5"],
            "final_phase": final["phase"],
            "accuracy_unit": "fraction of the validation images",
            "per_layer_sparsity": sparsity["per_layer"],
            "epochs": history,
        }
    )
    log.close()
    if dist.is_main:
        print(
            f"final sparse model ({cfg.model.timm_name} {model_preset or ''}, {opt['name']}, AC/DC at "
            f"{acdc.sparsity:.0%}; measured sparsity {sparsity['overall']:.4f} of {sparsity['numel']:,} prunable "
            f"weights): top-1 {final['top1']:.4f}, top-5 {final['top5']:.4f} on {len(val_set)} validation images"
        )
        print(f"run folder: {run_dir}")
    return summary


# An absolute path: the configs are found whether this file runs as a script or is imported.
@hydra.main(config_path=str(Path(__file__).resolve().parent / "configs"), config_name="train_vit", version_base="1.3")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    try:
        run(cfg, run_dir=Path(hydra_cfg.runtime.output_dir), model_preset=hydra_cfg.runtime.choices.get("model"))
    except (ConfigError, DataLayoutError, CheckpointError) as error:
        sys.exit(f"error: {error}")
    except NonFiniteLossError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(NON_FINITE_EXIT_CODE)
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main()
