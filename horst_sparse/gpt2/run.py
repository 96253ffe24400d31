"""Train GPT-2, prune copies of it one-shot by magnitude, report perplexity on `eval_split`.

`run(cfg, run_dir)` is the whole pipeline, top to bottom; `train_gpt2.py` is its Hydra entry
point. The scaffolding around the loop (start-up, resume, checkpoints, preemption, the
non-finite guard) is `horst_sparse.training.runner.Run`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import pruning
from horst_sparse.gpt2.data import RandomWindows, check_run_vocabulary, load_data
from horst_sparse.gpt2.evaluate import evaluate_lm, one_shot_pruning, perplexity_table
from horst_sparse.gpt2.export import export_gpt2
from horst_sparse.gpt2.model import VOCAB_MULTIPLE, build_model, flops_per_token, lm_loss_fn, peak_flops
from horst_sparse.training.checkpoint import CheckpointError
from horst_sparse.training.distributed import all_reduce_mean, gradient_sync, parallelize, unsharded
from horst_sparse.training.engine import optimizer_overrides, use_engine_
from horst_sparse.training.env import autocast
from horst_sparse.training.optim import build_optimizer
from horst_sparse.training.run_log import optimizer_label, progress_bar
from horst_sparse.training.runner import Run, config_differences
from horst_sparse.training.schedule import build_lr_scheduler

# Besides horst_sparse.training.no_effect.NO_EFFECT, a continued run may change these: they are read only after
# training (the final evaluation and pruning rerun), so they change what is measured, not what is trained.
# A run with prune.at_steps reads them during training too: it keeps them (`curve_measured_alike`).
MAY_CHANGE_ON_RESUME = ("eval_split", "eval", "prune")


def seconds_since(started: float, device: torch.device, *, synchronize: bool) -> float:
    """Seconds from `started` (`time.time()`) to now; with `synchronize` (a log step) to the end
    of the work queued on a CUDA device: the device is waited for before the clock is read, so an
    interval's kernels count in its throughput, not the next one's."""
    if synchronize and device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.time() - started


def train_step(
    train_model: torch.nn.Module,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    step: int,
    accum: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    dtype: torch.dtype | None,
    grad_clip: float,
    watch_loss: Callable[..., None],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Update `step` + 1: forward, loss and backward over the `accum` micro-batches (`x`, `y`),
    the gradient-norm clip, the optimizer's step and the LR schedule's; `watch_loss` notes the
    update's loss (`Run.watch_loss`). Returns that loss (the mean over micro-batches and
    processes) and the gradient norm before clipping (None without a clip), both on the device:
    nothing in an update waits for the device (tests/test_no_host_read.py)."""
    device = next(model.parameters()).device
    loss_sum = torch.zeros((), device=device)
    for micro, (x, y) in enumerate(micro_batches):
        with gradient_sync(train_model, micro == accum - 1):
            with autocast(device, dtype):
                logits = train_model(x).logits
            loss = loss_fn(logits, y)
            del logits  # freed by the backward, not held through the next micro-batch's forward
            (loss / accum).backward()
        loss_sum += loss.detach()
    # The guard keeps its record on the device (`Run.watch_loss`) and is read at log intervals and
    # before every checkpoint; the loss is read at log intervals.
    step_loss = all_reduce_mean(loss_sum / accum)
    watch_loss(step_loss, step=step + 1)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip) if grad_clip > 0 else None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step_update(step + 1)
    return step_loss, grad_norm


def run(cfg: DictConfig, *, run_dir: str | Path) -> dict:
    """Train, prune and evaluate as `cfg` says, writing into `run_dir`; returns the summary."""
    r = Run(
        cfg,
        run_dir,
        title=f"{cfg.model.name} {optimizer_label(cfg.optimizer)} seed{cfg.seed}",
        tags=[cfg.optimizer.name, cfg.model.name, f"{cfg.data.name}"],
    )
    dist, device, t = r.dist, r.device, cfg.train

    context = cfg.model.n_positions
    data = load_data(cfg.data, context=context, is_main=r.is_main, eval_split=cfg.eval_split)
    train_tokens, val_tokens, eval_tokens = data.train, data.val, data.split(cfg.eval_split)
    if r.is_main:
        check_run_vocabulary(r.run_dir, data.vocabulary)
    batches = RandomWindows(train_tokens, context=context, seed=cfg.seed)

    # The logits padded to a multiple of 64 on CUDA only: same weights, and CPU runs as they were.
    vocab_multiple = VOCAB_MULTIPLE if device.type == "cuda" else 1

    def build() -> torch.nn.Module:
        model = build_model(cfg.model, vocab_size=data.vocab_size, vocab_multiple=vocab_multiple).to(device)
        return use_engine_(model, cfg.engine)

    model = build()
    # ddp: `train_model` wraps `model`; fsdp2: both are `model`, its weights sharded in place (before the optimizer).
    train_model = parallelize(
        model, cfg.distributed, info=dist, device=device, compile=cfg.compile, blocks=model.transformer.h, dtype=r.dtype
    )
    prunable = pruning.prunable_parameters(model, cfg.prune.preset)
    optimizer = build_optimizer(
        cfg.optimizer, model, lr=t.lr, prunable_names=prunable.keys(), **optimizer_overrides(cfg.engine)
    )
    scheduler = build_lr_scheduler(
        optimizer, total_steps=t.max_steps, warmup_steps=t.warmup_steps, min_lr=t.min_lr, warmup_lr=t.warmup_lr
    )

    def curve_measured_alike(state: dict, path: Path) -> None:
        """A run with prune.at_steps measures during training what the others read only after it:
        where the checkpoint's run or this one does, those settings stay as they were."""
        old = state["config"]
        if not (old["prune"].get("at_steps") or cfg.prune.at_steps):
            return
        differences = config_differences(
            {k: old.get(k) for k in MAY_CHANGE_ON_RESUME}, {k: r.config[k] for k in MAY_CHANGE_ON_RESUME}
        )
        if differences:
            raise CheckpointError(
                f"{path} was written by a run that measures its pruned perplexity during training (prune.at_steps) "
                f"with other settings ({'; '.join(differences)}); rerun with its settings or start a new run folder "
                "(hydra.run.dir=...) or resume=never"
            )

    state = r.restore(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        generators={"batches": batches.generator},
        lr=t.lr,
        may_change=MAY_CHANGE_ON_RESUME,
        check=curve_measured_alike,
    )
    step, train_loss = (state["step"], state["train_loss"]) if state else (0, float("nan"))
    curve = list(state.get("curve", [])) if state else []  # the points of prune.at_steps measured so far
    at_steps = set(cfg.prune.at_steps)
    step_loss = torch.full((), train_loss, device=device)  # the last update's loss, all-reduced, on the device
    loss_fn = lm_loss_fn(data.vocab_size, compile=cfg.compile)

    accum = t.batch_size // (t.micro_batch_size * dist.world_size)
    tokens_per_step = t.batch_size * context
    flops = flops_per_token(model, context) * tokens_per_step
    peak = peak_flops(device, t.peak_tflops)  # per device; None on CPU

    def evaluate(m: torch.nn.Module, max_windows: int | None, tokens=val_tokens) -> dict:
        return evaluate_lm(
            m,
            tokens,
            context=context,
            batch_size=cfg.eval.batch_size,
            device=device,
            dtype=r.dtype,
            rank=dist.rank,
            world_size=dist.world_size,
            max_windows=max_windows,
        )

    def evaluate_final(m: torch.nn.Module) -> dict:  # every reported perplexity: on eval_split
        return evaluate(m, max_windows=cfg.eval.max_windows, tokens=eval_tokens)

    # ---- training ------------------------------------------------------------------------
    model.train()
    bar = progress_bar(total=t.max_steps, initial=step, desc="train", disable=not r.is_main)
    train_seconds, logged_step = 0.0, step  # throughput excludes evaluation and checkpoints
    while step < t.max_steps:
        step_started = time.time()
        # Same global draw on every process; each takes its rows (DDP == one big batch).
        micro_batches = batches.update(
            t.batch_size, t.micro_batch_size, rank=dist.rank, world_size=dist.world_size, device=device
        )
        lr = optimizer.param_groups[0]["lr"]
        step_loss, grad_norm = train_step(
            train_model,
            model,
            optimizer,
            scheduler,
            micro_batches,
            step=step,
            accum=accum,
            loss_fn=loss_fn,
            dtype=r.dtype,
            grad_clip=t.grad_clip,
            watch_loss=r.watch_loss,
        )
        step += 1
        log_now = bool(t.log_interval) and (step % t.log_interval == 0 or step == t.max_steps)
        train_seconds += seconds_since(step_started, device, synchronize=log_now)
        bar.update()

        if log_now:
            r.check_losses()
            train_loss = step_loss.item()
            seconds = train_seconds / (step - logged_step)  # per update since the last log
            train_seconds, logged_step = 0.0, step
            metrics = {
                "train/loss": train_loss,
                "train/lr": lr,
                "train/tokens": step * tokens_per_step,
                "perf/tokens_per_s": tokens_per_step / seconds,
            }
            if grad_norm is not None:
                metrics["train/grad_norm"] = grad_norm.item()
            if peak:
                metrics["perf/mfu"] = flops / seconds / (peak * dist.world_size)
            r.log.log(metrics, step=step)
            bar.set_postfix(
                loss=f"{train_loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_step / seconds:,.0f}", refresh=False
            )
        if t.eval_interval and (step % t.eval_interval == 0 or step == t.max_steps):
            val = evaluate(unsharded(model, build), max_windows=t.eval_windows)
            r.log.log({"val/loss": val["loss"], "val/ppl": val["ppl"]}, step=step)
            bar.write(f"step {step}: val loss {val['loss']:.4f} (ppl {val['ppl']:.2f}, {val['tokens']} tokens)")
        if step in at_steps:  # a point of the curve: as the final pruning, on copies of the weights
            points = one_shot_pruning(
                unsharded(model, build), cfg.prune, evaluate_final, calibration_tokens=train_tokens
            )
            curve += [
                {"step": step, **{k: p[k] for k in ("label", "method", "pattern", "sparsity", "val_loss", "ppl")}}
                for p in points["results"]
            ]
            r.log.log({f"curve/ppl@{p['label']}": p["ppl"] for p in points["results"]}, step=step)
            bar.write(
                f"step {step}: {cfg.eval_split} perplexity "
                + ", ".join(f"{p['label']}: {p['ppl']:.2f}" for p in points["results"])
            )
        if (t.checkpoint_interval and step % t.checkpoint_interval == 0) or step == t.max_steps:
            r.save(step=step, train_loss=step_loss.item(), curve=curve)
        elif (not dist.enabled or step % max(t.log_interval, 1) == 0) and r.preempted():  # a collective under DDP
            r.exit_for_requeue(step=step, bar=bar, train_loss=step_loss.item(), curve=curve)
    bar.close()
    model = unsharded(model, build)  # fsdp2: the whole weights, in a plain model on every process
    prunable = pruning.prunable_parameters(model, cfg.prune.preset)

    # The trained dense model's weight distribution (the paper's AdamW vs HORST figure).
    counts, edges = pruning.magnitude_histogram(prunable, bins=100, log=True)
    histogram = {"of": "log10|w| of the prunable weights of the trained dense model", "counts": counts, "edges": edges}
    r.log.write_json("weight_histogram.json", histogram)
    r.log.log_histogram("weights/log10_abs", counts, edges, step=step)

    # ---- one-shot magnitude pruning of copies of the trained model, perplexity of each -----
    def stop_if_preempted() -> None:  # the final checkpoint exists: a requeued run redoes this evaluation
        if r.preempted():
            r.exit_for_requeue(step=step, save=False)

    evaluation = one_shot_pruning(
        model,
        cfg.prune,
        evaluate_final,
        calibration_tokens=train_tokens,
        before_each=stop_if_preempted,
        after_each=lambda row: (
            r.is_main
            and tqdm.write(
                f"one-shot {row['method']} {row['pattern']} at {row['sparsity']:g}: {cfg.eval_split} perplexity {row['ppl']:.2f}"
            )
        ),
    )
    evaluation["eval_split"] = cfg.eval_split
    if cfg.prune.at_steps:
        evaluation["curve"] = curve  # the rows at each of prune.at_steps; the final model's are `results`
    for p in evaluation["results"]:  # the JSONL record; W&B gets them as one table and a plot
        r.log.log(
            {
                f"prune/ppl@{p['label']}": p["ppl"],
                f"prune/loss@{p['label']}": p["val_loss"],
                "prune/eval_split": cfg.eval_split,
            },
            step=step,
            to_wandb=False,
        )
    r.log.log_table(
        "prune/perplexity",
        evaluation["results"],
        step=step,
        plot=("sparsity", "ppl", f"{cfg.eval_split} perplexity after one-shot pruning"),
    )

    opt = OmegaConf.to_container(cfg.optimizer, resolve=True)
    hyperparameters = ", ".join(f"{k}={v}" for k, v in opt.items() if k not in ("name", "_target_", "_partial_"))
    parameters = sum(p.numel() for p in model.parameters())
    title = (
        f"{cfg.eval_split.capitalize()} perplexity after one-shot pruning ({', '.join(cfg.prune.methods)}; {', '.join(map(str, cfg.prune.patterns))}; "
        f"magnitude {cfg.prune.scope}): GPT-2 "
        f"({cfg.model.name}, {parameters / 1e6:.1f}M params), {opt['name']} ({hyperparameters}, lr={t.lr}), "
        f"{step * tokens_per_step:,} training tokens; {evaluation['tokens']:,} {cfg.eval_split} tokens in "
        f"{evaluation['windows']} non-overlapping windows of {context}."
    )
    table = perplexity_table(evaluation["results"], title=title)
    r.log.write_json("perplexity.json", evaluation)
    r.log.write_text("perplexity.md", table)
    summary = r.finish(
        {
            "pipeline": "gpt2",
            "model": {
                "preset": cfg.model.name,
                **OmegaConf.to_container(cfg.model, resolve=True),
                "parameters": parameters,
                "prunable_parameters": sum(p.numel() for p in prunable.values()),
            },
            "optimizer": {**opt, "lr": t.lr, "min_lr": t.min_lr, "warmup_steps": t.warmup_steps},
            "data": {
                "name": cfg.data.name,
                "dir": str(cfg.data.dir),
                "train_tokens": len(train_tokens),
                "val_tokens": len(val_tokens),
                **({"test_tokens": len(data.test)} if data.test is not None else {}),
                "vocabulary": cfg.data.vocabulary,
                "vocab_size": data.vocab_size,
            },
            "train": {
                "steps": step,
                "batch_size": t.batch_size,
                "context": context,
                "tokens_trained": step * tokens_per_step,
                "final_train_loss": step_loss.item(),
                "wall_time_s": r.elapsed_s,
                "world_size": dist.world_size,
                "distributed": cfg.distributed,
                "device": str(device),
            },
            "seed": cfg.seed,
            "eval_split": cfg.eval_split,
            "pruning": evaluation,
            "ppl": {p["label"]: p["ppl"] for p in evaluation["results"]},
        },
        files=("perplexity.md", "perplexity.json"),
    )
    if cfg.export.enabled:  # one pruned copy as a transformers folder with a model card (horst_sparse/gpt2/export.py)
        e = cfg.export
        exported = export_gpt2(
            model,
            cfg,
            e.dir or r.run_dir / "export",
            sparsity=e.sparsity,
            method=e.method,
            pattern=e.pattern,
            evaluate=evaluate_final,
            calibration_tokens=train_tokens,
            evaluation=evaluation,
            summary=summary,
            write=r.is_main,
            vocabulary=data.vocabulary,
        )
    if r.is_main:
        print(table)
        if cfg.export.enabled:
            print(f"exported: {exported['dir']} ({e.method}, {e.pattern}, perplexity {exported['ppl']:.2f})")
        print(f"run folder: {r.run_dir}")
    return summary
