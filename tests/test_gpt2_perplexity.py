"""Validation perplexity against a direct computation with the model's own loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from training.gpt2.model import build_model, flops_per_token
from training.gpt2.evaluate import evaluate_lm, window_starts


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    # n_positions > context so the direct computation can feed context + 1 tokens.
    cfg = OmegaConf.create(dict(n_layer=2, n_head=2, n_embd=32, n_positions=48, dropout=0.0, tie_word_embeddings=True))
    return build_model(cfg).eval()


def test_perplexity_matches_the_models_own_loss(model):
    context = 32
    tokens = np.random.default_rng(0).integers(0, 50257, size=32 * 7 + 11).astype(np.uint16)  # last window short

    result = evaluate_lm(model, tokens, context=context, batch_size=3, device=torch.device("cpu"))

    # Direct: window i predicts tokens [i*T+1, (i+1)*T+1) from its own prefix. A causal model
    # gives the same logits for those positions when fed the window plus its target token,
    # so HF's shifted-label loss over context + 1 tokens is exactly that window's loss.
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(tokens) - 1, context):
            window = torch.from_numpy(tokens[start : start + context + 1].astype(np.int64))[None]
            loss = model(input_ids=window, labels=window).loss
            nll += loss.item() * (window.shape[1] - 1)
            count += window.shape[1] - 1
    assert result["tokens"] == count == len(tokens) - 1
    assert result["windows"] == 8 and result["context"] == context
    assert result["loss"] == pytest.approx(nll / count, rel=1e-5)
    assert result["ppl"] == pytest.approx(math.exp(nll / count), rel=1e-5)


def test_max_windows_and_sharding(model):
    tokens = np.random.default_rng(1).integers(0, 50257, size=400).astype(np.uint16)
    first = evaluate_lm(model, tokens, context=32, batch_size=4, device=torch.device("cpu"), max_windows=3)
    assert first["windows"] == 3 and first["tokens"] == 96
    assert window_starts(400, 32) == list(range(0, 399, 32))
    # Each process takes every world_size-th window; the union covers them all once.
    parts = [
        evaluate_lm(model, tokens, context=32, batch_size=4, device=torch.device("cpu"), rank=r, world_size=2)
        for r in range(2)
    ]
    assert sum(p["tokens"] for p in parts) == len(tokens) - 1


def test_flops_per_token_counts_six_n_plus_attention(model):
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    assert flops_per_token(model, 32) == 6 * n + 12 * 2 * 32 * 32
