"""Train GPT-2 with AdamW, HAM or HORST, prune it one-shot by magnitude, report perplexity.

    python train_gpt2.py                                     # embedded default (CPU, ~2 min)
    python train_gpt2.py optimizer=adamw train.max_steps=300
    python train_gpt2.py experiment=gpt2_small_slimpajama    # the paper's setting
    torchrun --nproc_per_node=8 train_gpt2.py experiment=gpt2_small_slimpajama

Config: configs/train_gpt2.yaml (schema in training/gpt2.py). Everything a run produces
lands in its Hydra run folder: config.yaml, metrics.jsonl, checkpoints, perplexity.json /
perplexity.md (validation perplexity after one-shot layerwise magnitude pruning at each
sparsity) and summary.json.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import time
from pathlib import Path

import hydra
import torch
import torch.nn.functional as F
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
from training.distributed import all_reduce_mean, barrier, broadcast_object, init_distributed, shutdown_distributed
from training.env import autocast, autocast_dtype, device_type, peak_flops, seed_everything, select_device
from training.gpt2 import PREPARE_SLIMPAJAMA, build_model, flops_per_token, register_configs, validate
from training.guards import NON_FINITE_EXIT_CODE, NonFiniteLossError, check_finite_loss
from training.lm_data import META_FILE, DatasetNotPreparedError, RandomWindows, load_split, prepare_pydoc
from training.optim import build_optimizer
from training.perplexity import evaluate_lm
from training.preemption import PreemptionGuard
from training.run_log import RunLogger
from training.schedule import build_lr_scheduler

register_configs()


def load_data(cfg: DictConfig, *, is_main: bool):
    folder = Path(cfg.data.dir)
    if cfg.data.name == "pydoc" and not (folder / META_FILE).is_file():
        if is_main:
            prepare_pydoc(folder)  # embedded: a few seconds, no download
        barrier()
    command = "rm -r {dir} and rerun" if cfg.data.name == "pydoc" else PREPARE_SLIMPAJAMA
    command = command.format(dir=folder)
    return load_split(folder, "train", prepare_command=command), load_split(folder, "val", prepare_command=command)


def one_shot_pruning(model: torch.nn.Module, cfg: DictConfig, evaluate) -> dict:
    """Prune a copy of `model` at each of `prune.sparsities` by magnitude (no retraining) and
    evaluate it on the same validation windows (DESIGN §3.4)."""
    results = []
    for sparsity in cfg.prune.sparsities:
        pruned = copy.deepcopy(model)
        weights = pruning.prunable_parameters(pruned, cfg.prune.preset)
        if sparsity > 0:
            pruning.prune_(weights, sparsity, scope=cfg.prune.scope)
        val = evaluate(pruned, max_windows=cfg.eval.max_windows)
        measured = pruning.sparsity_stats(weights)["overall"]
        results.append({"sparsity": sparsity, "measured_sparsity": measured, "val_loss": val["loss"], "ppl": val["ppl"]})
        del pruned
    return {
        "method": "one-shot magnitude pruning (no retraining)",
        "scope": cfg.prune.scope,
        "preset": cfg.prune.preset,
        "context": val["context"],
        "windows": val["windows"],
        "tokens": val["tokens"],
        "results": results,
    }


def perplexity_table(results: list[dict], *, title: str) -> str:
    lines = [title, "", "| sparsity | measured sparsity | val loss | val perplexity |", "|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['sparsity']:.2f} | {r['measured_sparsity']:.4f} | {r['val_loss']:.4f} | {r['ppl']:.2f} |")
    return "\n".join(lines) + "\n"


def run(cfg: DictConfig, *, run_dir: Path, model_preset: str | None = None) -> dict:
    """Train, prune and evaluate as `cfg` says, writing into `run_dir`; returns the summary."""
    started = time.time()
    dist = init_distributed(device_type(cfg.device))
    validate(cfg, model_choice=model_preset, world_size=dist.world_size)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    device = select_device(cfg.device, local_rank=dist.local_rank)
    # Each process's Hydra picks its own time-stamped folder; all use the main process's.
    run_dir = Path(broadcast_object(str(run_dir)))
    dtype = autocast_dtype(cfg.precision, device)
    seed_everything(cfg.seed, deterministic=cfg.deterministic)

    train_tokens, val_tokens = load_data(cfg, is_main=dist.is_main)
    context = cfg.model.n_positions
    batches = RandomWindows(train_tokens, context=context, seed=cfg.seed)

    model = build_model(cfg.model).to(device)
    prunable = pruning.prunable_parameters(model, cfg.prune.preset)
    optimizer = build_optimizer(cfg.optimizer, model, lr=cfg.train.lr, prunable_names=prunable.keys())
    t = cfg.train
    scheduler = build_lr_scheduler(
        optimizer, total_steps=t.max_steps, warmup_steps=t.warmup_steps, min_lr=t.min_lr, warmup_lr=t.warmup_lr
    )

    step, elapsed_before, train_loss = 0, 0.0, float("nan")
    resume_from = resolve_resume(cfg.resume, run_dir)
    if resume_from is not None:
        state = restore_training_state(
            load_checkpoint(resume_from, map_location=device),
            model=model, optimizer=optimizer, scheduler=scheduler, generators={"batches": batches.generator},
        )  # fmt: skip
        for key in ("model", "optimizer"):  # continuing another model or optimizer would mislead
            if state["config"][key] != resolved[key]:
                raise ConfigError(
                    f"resume: {resume_from} was trained with {key}={state['config'][key]}, not {resolved[key]}; "
                    "use resume=never or another run folder (hydra.run.dir=...)"
                )
        step, elapsed_before, train_loss = state["step"], state["elapsed_s"], state["train_loss"]
        scheduler.step_update(step)
    log = RunLogger(
        run_dir, resolved, enabled=dist.is_main, project=cfg.logging.project, name=cfg.logging.name or run_dir.name,
        group=cfg.logging.group, tags=list(cfg.logging.tags), mode=cfg.logging.mode,
        resume_step=step if resume_from is not None else None,
    )  # fmt: skip
    if resume_from is not None and dist.is_main:
        tqdm.write(f"resumed from {resume_from} at step {step}")

    train_model = torch.compile(model) if cfg.compile else model
    if dist.enabled:
        train_model = DistributedDataParallel(train_model, device_ids=[device.index] if device.type == "cuda" else None)
    accum = t.batch_size // (t.micro_batch_size * dist.world_size)
    tokens_per_step = t.batch_size * context
    flops = flops_per_token(model, context) * tokens_per_step
    peak = peak_flops(device, t.peak_tflops)  # per device; None on CPU

    def evaluate(m: torch.nn.Module, **kw) -> dict:
        return evaluate_lm(
            m, val_tokens, context=context, batch_size=cfg.eval.batch_size, device=device, dtype=dtype,
            rank=dist.rank, world_size=dist.world_size, **kw,
        )  # fmt: skip

    def save(step: int, train_loss: float) -> None:
        if dist.is_main:
            path = checkpoint_path(run_dir, step)
            log.checkpoint(path, step=step)  # before the file: a resume from it always finds its marker
            state = training_state(
                model=model, optimizer=optimizer, scheduler=scheduler, step=step, config=resolved,
                generators={"batches": batches.generator}, elapsed_s=elapsed_before + time.time() - started,
                train_loss=train_loss,
            )  # fmt: skip
            save_checkpoint(state, path)
            prune_old_checkpoints(run_dir, keep=t.keep_checkpoints)
        barrier()

    # ---- training ------------------------------------------------------------------------
    model.train()
    bar = tqdm(total=t.max_steps, initial=step, desc="train", disable=not dist.is_main, dynamic_ncols=True)
    train_seconds, logged_step, tokens_per_s = 0.0, step, float("nan")  # throughput excludes eval/checkpoints
    preemption = PreemptionGuard()  # SLURM's pre-timeout signal: checkpoint, then requeue
    while step < t.max_steps:
        step_started = time.time()
        # Same global draw on every process; each takes its rows (DDP == one big batch).
        offsets = batches.global_offsets(t.batch_size).view(dist.world_size, accum, t.micro_batch_size)[dist.rank]
        loss_sum = torch.zeros((), device=device)
        for micro in range(accum):
            x, y = batches.batch(offsets[micro], device)
            sync = not dist.enabled or micro == accum - 1
            with contextlib.nullcontext() if sync else train_model.no_sync():
                with autocast(device, dtype):
                    logits = train_model(x).logits
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
                (loss / accum).backward()
            loss_sum += loss.detach()
        train_loss = all_reduce_mean(loss_sum / accum).item()
        check_finite_loss(train_loss, step=step + 1, run_dir=run_dir, hint="train.lr (or optimizer.alpha)")
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip) if t.grad_clip > 0 else None
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        scheduler.step_update(step)
        train_seconds += time.time() - step_started

        if t.log_interval and (step % t.log_interval == 0 or step == t.max_steps):
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = train_seconds / (step - logged_step)  # per update since the last log
            train_seconds, logged_step, tokens_per_s = 0.0, step, tokens_per_step / seconds
            metrics = {"train/loss": train_loss, "lr": lr, "tokens": step * tokens_per_step, "tokens_per_s": tokens_per_s}
            if grad_norm is not None:
                metrics["train/grad_norm"] = grad_norm.item()
            if peak:
                metrics["mfu"] = flops / seconds / (peak * dist.world_size)
            log.log(metrics, step=step)
        bar.set_postfix(loss=f"{train_loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
        bar.update()
        if t.eval_interval and (step % t.eval_interval == 0 or step == t.max_steps):
            val = evaluate(model, max_windows=t.eval_windows)
            log.log({"val/loss": val["loss"], "val/ppl": val["ppl"]}, step=step)
            bar.write(f"step {step}: val loss {val['loss']:.4f} (ppl {val['ppl']:.2f}, {val['tokens']} tokens)")
        if (t.checkpoint_interval and step % t.checkpoint_interval == 0) or step == t.max_steps:
            save(step, train_loss)
        elif preemption.requested():
            save(step, train_loss)
            bar.close()
            log.close()
            preemption.requeue_or_exit()
    preemption.close()
    bar.close()

    # The trained dense model's weight distribution (the paper's AdamW vs HORST figure).
    counts, edges = pruning.magnitude_histogram(prunable, bins=100, log=True)
    histogram = {"of": "log10|w| of the prunable weights of the trained dense model", "counts": counts, "edges": edges}
    log.write_json("weight_histogram.json", histogram)

    # ---- one-shot magnitude pruning of copies of the trained model, perplexity of each -----
    evaluation = one_shot_pruning(model, cfg, evaluate)
    for r in evaluation["results"]:
        log.log({f"prune/ppl@{r['sparsity']:g}": r["ppl"], f"prune/loss@{r['sparsity']:g}": r["val_loss"]}, step=step)

    opt = OmegaConf.to_container(cfg.optimizer, resolve=True)
    title = (
        f"Validation perplexity after one-shot {cfg.prune.scope} magnitude pruning: GPT-2 "
        f"({model_preset}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params), "
        f"{opt['name']} ({', '.join(f'{k}={v}' for k, v in opt.items() if k != 'name')}, lr={t.lr}), "
        f"{step * tokens_per_step:,} training tokens; {evaluation['tokens']:,} validation tokens in "
        f"{evaluation['windows']} non-overlapping windows of {context}."
    )
    table = perplexity_table(evaluation["results"], title=title)
    log.write_json("perplexity.json", evaluation)
    log.write_text("perplexity.md", table)
    summary = log.summary(
        {
            "pipeline": "gpt2",
            "model": {
                "preset": model_preset,
                **OmegaConf.to_container(cfg.model, resolve=True),
                "parameters": sum(p.numel() for p in model.parameters()),
                "prunable_parameters": sum(p.numel() for p in prunable.values()),
            },
            "optimizer": {**opt, "lr": t.lr, "min_lr": t.min_lr, "warmup_steps": t.warmup_steps},
            "data": {
                "name": cfg.data.name,
                "dir": str(cfg.data.dir),
                "train_tokens": len(train_tokens),
                "val_tokens": len(val_tokens),
            },
            "train": {
                "steps": step,
                "batch_size": t.batch_size,
                "context": context,
                "tokens_trained": step * tokens_per_step,
                "final_train_loss": train_loss,
                "wall_time_s": elapsed_before + time.time() - started,
                "world_size": dist.world_size,
                "device": str(device),
            },
            "seed": cfg.seed,
            "pruning": evaluation,
            "ppl": {f"{r['sparsity']:g}": r["ppl"] for r in evaluation["results"]},
        }
    )
    log.close()
    if dist.is_main:
        print(table)
        print(f"run folder: {run_dir}")
    return summary


# An absolute path: the configs are found whether this file runs as a script or is imported.
@hydra.main(config_path=str(Path(__file__).resolve().parent / "configs"), config_name="train_gpt2", version_base="1.3")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    try:
        run(cfg, run_dir=Path(hydra_cfg.runtime.output_dir), model_preset=hydra_cfg.runtime.choices.get("model"))
    except (ConfigError, DatasetNotPreparedError, CheckpointError) as error:
        sys.exit(f"error: {error}")
    except NonFiniteLossError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(NON_FINITE_EXIT_CODE)
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main()
