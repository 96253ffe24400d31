"""Validation loss and perplexity of a causal language model (DESIGN §3.4).

Non-overlapping windows of the context length tile the validation tokens: window i feeds
tokens [i*T, (i+1)*T) and predicts tokens [i*T+1, (i+1)*T+1), so every token but the first
is predicted exactly once (the last window may be shorter). The loss is the token-weighted
mean negative log-likelihood over all predicted tokens, perplexity its exponential.
Windows are shared out over processes and the sums all-reduced.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

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
