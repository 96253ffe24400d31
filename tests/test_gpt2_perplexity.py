"""Perplexity against a direct computation with the model's own loss, and on the split `eval_split` says."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from horst_sparse.gpt2.evaluate import evaluate_lm, window_starts
from horst_sparse.gpt2.model import build_model, flops_per_token


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


def test_a_run_reports_every_perplexity_on_the_split_eval_split_says(tmp_path, monkeypatch):
    """eval_split=test: every one-shot row (the dense model too) is the final model's
    perplexity on the test tokens, the periodic loss stays on validation; eval_split=
    validation: the test split is never read."""
    import horst_sparse.gpt2.data as gpt2_data
    from horst_sparse.compose import compose
    from horst_sparse.gpt2.data import load_data
    from horst_sparse.gpt2.run import run
    from horst_sparse.pipeline import get
    from horst_sparse.training.checkpoint import latest_checkpoint, load_checkpoint

    monkeypatch.setenv("WANDB_MODE", "disabled")
    overrides = [
        "model=gpt2_nano",
        f"data.dir={tmp_path / 'pydoc'}",
        "device=cpu",
        "cpu_threads=1",
        "train.max_steps=4",
        "train.warmup_steps=1",
        "train.batch_size=2",
        "train.micro_batch_size=2",
        "train.eval_interval=4",
        "train.eval_windows=8",
        "eval.max_windows=16",
        "prune.sparsities=[0.0,0.5]",
    ]
    read, load_split = [], gpt2_data.load_split
    monkeypatch.setattr(
        gpt2_data, "load_split", lambda folder, split, **kw: read.append(split) or load_split(folder, split, **kw)
    )
    validation_cfg = compose(get("gpt2"), overrides)
    test_cfg = compose(get("gpt2"), [*overrides, "eval_split=test"])
    assert run(validation_cfg, run_dir=tmp_path / "validation")["eval_split"] == "validation"
    assert "test" not in read and "validation" in read
    summary = run(test_cfg, run_dir=tmp_path / "test")
    assert (
        summary["eval_split"] == summary["pruning"]["eval_split"] == "test" and summary["data"]["test_tokens"] > 10_000
    )

    data = load_data(test_cfg.data, context=32, is_main=True, eval_split="test")
    model = build_model(test_cfg.model, vocab_size=data.vocab_size)
    model.load_state_dict(load_checkpoint(latest_checkpoint(tmp_path / "test"))["model"])
    on = lambda tokens, windows: evaluate_lm(
        model, tokens, context=32, batch_size=16, device=torch.device("cpu"), max_windows=windows
    )  # noqa: E731
    assert summary["ppl"]["0"] == pytest.approx(on(data.test, 16)["ppl"], rel=1e-5)
    assert summary["pruning"]["tokens"] == 16 * 32
    periodic = [json.loads(line) for line in (tmp_path / "test" / "metrics.jsonl").read_text().splitlines()]
    assert [r["val/loss"] for r in periodic if "val/loss" in r] == pytest.approx([on(data.val, 8)["loss"]], rel=1e-5)
    assert [r["prune/eval_split"] for r in periodic if "prune/eval_split" in r] == ["test", "test"]
