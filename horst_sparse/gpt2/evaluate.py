"""Validation loss and perplexity of a causal language model, and of one-shot pruned copies
of it (docs/design.md §3.4): by magnitude or Wanda, unstructured or N:M.

Non-overlapping windows of the context length tile the validation tokens: window i feeds
tokens [i*T, (i+1)*T) and predicts tokens [i*T+1, (i+1)*T+1), so every token but the first
is predicted exactly once (the last window may be shorter). The loss is the token-weighted
mean negative log-likelihood over all predicted tokens, perplexity its exponential.
Windows are shared out over processes and the sums all-reduced.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

import pruning
from horst_sparse.gpt2.data import RandomWindows
from horst_sparse.gpt2.model import lm_loss
from horst_sparse.training.distributed import all_reduce_sum
from horst_sparse.training.env import autocast


def window_starts(num_tokens: int, context: int, *, max_windows: int | None = None) -> list[int]:
    starts = list(range(0, num_tokens - 1, context))
    return starts[:max_windows] if max_windows is not None else starts


@torch.no_grad()
def _summed_nll(model, windows: list[np.ndarray], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Summed next-token NLL and number of predicted tokens of equally long windows. Nothing
    here waits for the device: the batch is copied from pinned memory without blocking, so the
    host stacks the next windows while the device computes."""
    batch = torch.from_numpy(np.stack(windows).astype(np.int64))
    if device.type == "cuda":
        batch = batch.pin_memory().to(device, non_blocking=True)
    with autocast(device, dtype):
        logits = model(batch[:, :-1]).logits
    nll = lm_loss(logits, batch[:, 1:], vocab_size=model.config.vocab_size, reduction="sum")
    count = torch.full((), batch[:, 1:].numel(), dtype=torch.float64, device=device)  # a fill: no host copy
    return torch.stack([nll.double(), count])


@torch.no_grad()
def evaluate_lm(
    model: torch.nn.Module,
    tokens: np.ndarray,
    *,
    context: int,
    batch_size: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    max_windows: int | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> dict[str, float]:
    """`{"loss", "ppl", "tokens", "windows", "context"}` over the windows of `tokens`, with the
    forward pass autocast to `dtype`.

    `max_windows` keeps the first windows only (quick periodic validation)."""
    starts = window_starts(len(tokens), context, max_windows=max_windows)
    was_training = model.training
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # summed NLL, predicted tokens
    mine = starts[rank::world_size]
    for first in range(0, len(mine), batch_size):
        windows = [tokens[s : s + context + 1] for s in mine[first : first + batch_size]]
        # Only the stream's last window can be shorter; it is evaluated on its own.
        for group in ([w for w in windows if len(w) == context + 1], [w for w in windows if len(w) <= context]):
            if group:
                totals += _summed_nll(model, group, device, dtype)
    all_reduce_sum(totals)
    model.train(was_training)
    nll_sum, count = totals.tolist()
    loss = nll_sum / count
    return {"loss": loss, "ppl": math.exp(loss), "tokens": int(count), "windows": len(starts), "context": context}


def calibration_batches(
    tokens: np.ndarray, *, context: int, windows: int, seed: int, batch_size: int = 8
) -> list[torch.Tensor]:
    """`windows` random windows of `context` tokens from `tokens` (the training split), drawn
    with their own generator seeded `seed` (the same windows for every method, run and
    process), as int64 batches of up to `batch_size` windows: Wanda's calibration data."""
    draw = RandomWindows(tokens, context=context, seed=seed)
    inputs, _ = draw.batch(draw.global_offsets(windows), torch.device("cpu"))
    return list(inputs.split(batch_size))


@torch.no_grad()
def input_norms(model: torch.nn.Module, weights: dict, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """||X_j||_2 of each prunable matrix's input features over the calibration batches, from
    one forward pass of the dense model in fp32 (`pruning.InputNorms`)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    with pruning.InputNorms(model, weights) as collector:
        for batch in batches:
            model(batch.to(device))
    model.train(was_training)
    return collector.norms()


def prune_copy(
    model: torch.nn.Module,
    *,
    preset: str,
    method: str,
    pattern: str,
    sparsity: float,
    scope: str = "layerwise",
    norms: dict[str, torch.Tensor] | None = None,
) -> torch.nn.Module:
    """A pruned deep copy of `model`: its `preset` matrices pruned by `method` in `pattern`
    (`pruning.one_shot_masks`; N:M groups along each matrix's input dimension, which is dim
    0 of GPT-2's Conv1D weights [in, out]). Pattern "dense", or sparsity 0 with
    "unstructured", is the dense copy."""
    pruned = copy.deepcopy(model)
    weights = pruning.prunable_parameters(pruned, preset)
    if pattern != "dense" and (pattern != pruning.UNSTRUCTURED or sparsity > 0):
        pruning.one_shot_prune_(
            weights,
            method=method,
            pattern=pattern,
            sparsity=sparsity,
            scope=scope,
            dim=pruning.input_dims(pruned, weights),
            input_norms=norms,
        )
    return pruned


def result_label(method: str, pattern: str, sparsity: float) -> str:
    """The key of a result in logs and `summary["ppl"]`: the sparsity alone for the paper's
    magnitude/unstructured rows and the dense model ("0", "0.5", ...), else e.g.
    "wanda@0.5", "magnitude@2:4", "wanda@2:4"."""
    if sparsity == 0 or (method, pattern) == ("magnitude", pruning.UNSTRUCTURED):
        return f"{sparsity:g}"
    return f"{method}@{sparsity:g}" if pattern == pruning.UNSTRUCTURED else f"{method}@{pattern}"


def one_shot_plan(prune_cfg) -> list[tuple[str, str, float]]:
    """(method, pattern, sparsity) of every result row, in order: the dense model once (when
    0.0 is among `prune.sparsities`); then for each of `prune.methods` and each of
    `prune.patterns`: one row per non-zero sparsity of `prune.sparsities` for "unstructured",
    one row at 1 - n/m for an "n:m" pattern (its sparsity is fixed)."""
    rows = [("none", "dense", 0.0)] if 0.0 in prune_cfg.sparsities else []
    for method in prune_cfg.methods:
        for pattern in prune_cfg.patterns:
            if pattern == pruning.UNSTRUCTURED:
                rows += [(method, pattern, float(s)) for s in prune_cfg.sparsities if s > 0]
            else:
                rows.append((method, pattern, pruning.pattern_sparsity(pattern)))
    return rows


def comparison(method: str, pattern: str, scope: str) -> str:
    """Among which weights a row's scores compete."""
    if pattern == "dense":
        return "none"
    if pattern != pruning.UNSTRUCTURED:
        return f"per group of {pruning.parse_pattern(pattern)[1]} consecutive inputs"
    return scope if method == "magnitude" else "per output row"


def one_shot_pruning(
    model: torch.nn.Module,
    prune_cfg,
    evaluate,
    *,
    calibration_tokens: np.ndarray | None = None,
    before_each=lambda: None,
    after_each=lambda row: None,
) -> dict:
    """Prune copies of `model` one-shot (no retraining) as `prune.methods` x `prune.patterns` x
    `prune.sparsities` say (`one_shot_plan`) and evaluate each with `evaluate(model)` on the
    same validation windows; `before_each()` runs before each row (the pipeline's preemption
    check), `after_each(row)` after it (its progress line). Wanda's input norms come from `prune.calibration_windows` windows of
    `calibration_tokens` (the training split), computed once on the dense model.

    Every result row names its method, pattern, target and measured sparsity, loss and
    perplexity, and `label`, its key in logs and `summary["ppl"]` (`result_label`)."""
    context = model.config.n_positions
    norms, calibration = None, None
    if "wanda" in prune_cfg.methods:
        if calibration_tokens is None:
            raise ValueError("prune.methods has wanda: pass calibration_tokens (the training split)")
        batches = calibration_batches(
            calibration_tokens, context=context, windows=prune_cfg.calibration_windows, seed=prune_cfg.calibration_seed
        )
        norms = input_norms(model, pruning.prunable_parameters(model, prune_cfg.preset), batches)
        calibration = {
            "split": "train",
            "windows": prune_cfg.calibration_windows,
            "context": context,
            "tokens": prune_cfg.calibration_windows * context,
            "seed": prune_cfg.calibration_seed,
            "activations": "of the dense model, one pass",
        }
    results = []
    for method, pattern, sparsity in one_shot_plan(prune_cfg):
        before_each()
        pruned = prune_copy(
            model,
            preset=prune_cfg.preset,
            method=method,
            pattern=pattern,
            sparsity=sparsity,
            scope=prune_cfg.scope,
            norms=norms,
        )
        val = evaluate(pruned)
        measured = pruning.sparsity_stats(pruning.prunable_parameters(pruned, prune_cfg.preset))["overall"]
        results.append(
            {
                "label": result_label(method, pattern, sparsity),
                "method": method,
                "pattern": pattern,
                "comparison": comparison(method, pattern, prune_cfg.scope),
                "sparsity": sparsity,
                "measured_sparsity": measured,
                "val_loss": val["loss"],
                "ppl": val["ppl"],
            }
        )
        after_each(results[-1])
        del pruned
    return {
        "method": "one-shot pruning (no retraining)",
        "methods": list(prune_cfg.methods),
        "patterns": list(prune_cfg.patterns),
        "scope": prune_cfg.scope,
        "preset": prune_cfg.preset,
        "calibration": calibration,
        "context": val["context"],
        "windows": val["windows"],
        "tokens": val["tokens"],
        "results": results,
    }


def perplexity_table(results: list[dict], *, title: str) -> str:
    lines = [
        title,
        "",
        "| method | pattern | sparsity | measured sparsity | loss | perplexity |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['method']} | {r['pattern']} | {r['sparsity']:.2f} | {r['measured_sparsity']:.4f} | "
            f"{r['val_loss']:.4f} | {r['ppl']:.2f} |"
        )
    return "\n".join(lines) + "\n"
