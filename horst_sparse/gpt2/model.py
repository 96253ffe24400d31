"""The GPT-2 model: Hugging Face's `GPT2LMHeadModel` built from a preset in
`configs/model/gpt2_*.yaml` (docs/design.md §4: GPT-2 Small is 12 layers, 768 wide, 12
heads, context 1024, no dropout, tied embeddings), and its training FLOPs per token."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

VOCAB_SIZE = 50257  # GPT-2's BPE


def build_model(model_cfg: DictConfig, *, vocab_size: int = VOCAB_SIZE) -> torch.nn.Module:
    """A randomly initialised `GPT2LMHeadModel` with SDPA attention over `vocab_size` tokens
    (GPT-2's, or a corpus's compact vocabulary: `horst_sparse.gpt2.data.LMData.vocab_size`)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=model_cfg.n_positions,
        n_embd=model_cfg.n_embd,
        n_layer=model_cfg.n_layer,
        n_head=model_cfg.n_head,
        resid_pdrop=model_cfg.dropout,
        embd_pdrop=model_cfg.dropout,
        attn_pdrop=model_cfg.dropout,
        tie_word_embeddings=model_cfg.tie_word_embeddings,
        bos_token_id=vocab_size - 1,  # <|endoftext|>: GPT-2's last id, and the compact vocabulary's (ids ascend)
        eos_token_id=vocab_size - 1,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return GPT2LMHeadModel(config)


def flops_per_token(model, context: int) -> float:
    """Training FLOPs per token (forward + backward): 6 N plus attention, N without the
    position embedding (PaLM appendix B; the token embedding counts as the tied output layer)."""
    c = model.config
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    return 6 * n + 12 * c.n_layer * c.n_embd * context
