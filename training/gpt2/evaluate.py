"""Validation loss and perplexity of a causal language model, and of one-shot pruned copies
of it (docs/design.md §3.4).

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
import torch.nn.functional as F

import pruning
from training.distributed import all_reduce_sum
from training.env import autocast


def window_starts(num_tokens: int, context: int, *, max_windows: int | None = None) -> list[int]:
    starts = list(range(0, num_tokens - 1, context))
    return starts[:max_windows] if max_windows is not None else starts


@torch.no_grad()
def _summed_nll(model, windows: list[np.ndarray], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Summed next-token NLL and number of predicted tokens of equally long windows."""
    batch = torch.from_numpy(np.stack(windows).astype(np.int64)).to(device)
    with autocast(device, dtype):
        logits = model(batch[:, :-1]).logits
    nll = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
    return torch.stack([nll.double(), torch.tensor(batch[:, 1:].numel(), dtype=torch.float64, device=device)])


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


def one_shot_pruning(model: torch.nn.Module, prune_cfg, evaluate, *, before_each=lambda: None) -> dict:
    """Prune a copy of `model` at each of `prune.sparsities` by magnitude (no retraining) and
    evaluate it with `evaluate(model)` on the same validation windows; `before_each()` runs
    before each sparsity (the pipeline's preemption check)."""
    results = []
    for sparsity in prune_cfg.sparsities:
        before_each()
        pruned = copy.deepcopy(model)
        weights = pruning.prunable_parameters(pruned, prune_cfg.preset)
        if sparsity > 0:
            pruning.prune_(weights, sparsity, scope=prune_cfg.scope)
        val = evaluate(pruned)
        measured = pruning.sparsity_stats(weights)["overall"]
        results.append({"sparsity": sparsity, "measured_sparsity": measured, "val_loss": val["loss"], "ppl": val["ppl"]})
        del pruned
    return {
        "method": "one-shot magnitude pruning (no retraining)",
        "scope": prune_cfg.scope,
        "preset": prune_cfg.preset,
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
