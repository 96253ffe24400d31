"""The GPT-2 model: Hugging Face's `GPT2LMHeadModel` built from a preset in
`configs/model/gpt2_*.yaml` (docs/design.md §4: GPT-2 Small is 12 layers, 768 wide, 12
heads, context 1024, no dropout, tied embeddings); its loss, training FLOPs per token and
the peak FLOP/s of a GPU, for model FLOPs utilisation."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

VOCAB_SIZE = 50257  # GPT-2's BPE
# The output layer's width on CUDA is padded up to a multiple of this (nanoGPT: 50257 -> 50304,
# "~25% speedup"): the logits matmul and their rows then align with the tensor-core tiles.
VOCAB_MULTIPLE = 64
# The attention of the pipeline's GPT-2: SDPA with `is_causal=True` and no mask (flash-eligible).
# Every sequence it is fed (training, evaluation, pruning's calibration) is one whole window of
# the corpus, never padded or packed, so the mask is the plain causal one. transformers' own
# "sdpa" finds that out anew in each eager forward by reading the device (whether the position
# ids hold packed sequences, or an attention mask has padding), a host sync that stalls a GPU's
# queue once per forward; registered under this name, the mask is not built.
WHOLE_WINDOWS = "sdpa_whole_windows"


def _no_mask(**kwargs) -> None:
    """transformers' mask function of `WHOLE_WINDOWS`: none, so that SDPA takes `is_causal=True`."""
    return None


def _register_whole_windows() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register(WHOLE_WINDOWS, sdpa_attention_forward)
    AttentionMaskInterface.register(WHOLE_WINDOWS, _no_mask)


def _whole_windows(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook of `GPT2Model`: an attention mask of ones where none is given. transformers
    looks for packed sequences only without one; `_no_mask` never reads it."""
    ids = args[0] if args else kwargs.get("input_ids")
    if kwargs.get("attention_mask") is None and ids is not None:
        kwargs["attention_mask"] = ids.new_ones(()).expand(ids.shape)
    return args, kwargs


class PaddedVocabHead(torch.nn.Module):
    """GPT-2's output layer computing `padded` logits: the tied embedding's rows, then zero rows
    up to a multiple of `multiple`. The weight keeps its shape (checkpoints, exports and pruning
    see the model's own vocabulary); `lm_loss` never reads the padded logits."""

    def __init__(self, head: torch.nn.Linear, multiple: int) -> None:
        super().__init__()
        self.weight = head.weight  # the tied embedding, shared
        self.padded = -(-self.weight.shape[0] // multiple) * multiple

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, F.pad(self.weight, (0, 0, 0, self.padded - self.weight.shape[0])))


def build_model(model_cfg: DictConfig, *, vocab_size: int = VOCAB_SIZE, vocab_multiple: int = 1) -> torch.nn.Module:
    """A randomly initialised `GPT2LMHeadModel` with SDPA attention over `vocab_size` tokens
    (GPT-2's, or a corpus's compact vocabulary: `horst_sparse.gpt2.data.LMData.vocab_size`),
    its logits padded to a multiple of `vocab_multiple` (`PaddedVocabHead`; the same weights
    and the same initialisation either way). It takes whole windows only (`WHOLE_WINDOWS`): an
    attention mask given to it is not read. An export (`save_pretrained`) is a plain GPT-2."""
    from transformers import GPT2Config, GPT2LMHeadModel

    _register_whole_windows()

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
        attn_implementation=WHOLE_WINDOWS,
    )
    model = GPT2LMHeadModel(config)
    model.transformer.register_forward_pre_hook(_whole_windows, with_kwargs=True)
    if vocab_size % vocab_multiple:
        model.lm_head = PaddedVocabHead(model.lm_head, vocab_multiple)
    return model


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of logits [N, >= vocab] of any float dtype over their first `vocab`
    columns, in fp32 one chunk of rows at a time: the saved state is the logits themselves and
    one log-sum-exp per row, and the gradient is written chunk by chunk in the logits' dtype."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, vocab: int, rows: int) -> torch.Tensor:
        lse = torch.cat([torch.logsumexp(chunk[:, :vocab].float(), dim=1) for chunk in logits.split(rows)])
        ctx.save_for_backward(logits, targets, lse)
        ctx.vocab, ctx.rows = vocab, rows
        return lse - logits.gather(1, targets[:, None]).squeeze(1).float()

    @staticmethod
    def backward(ctx, grad_nll: torch.Tensor):
        logits, targets, lse = ctx.saved_tensors
        vocab, rows = ctx.vocab, ctx.rows
        grad = torch.empty_like(logits)
        grad[:, vocab:] = 0  # the padded logits: no loss, no gradient
        for start in range(0, len(logits), rows):
            end = min(start + rows, len(logits))
            probs = torch.exp(logits[start:end, :vocab].float() - lse[start:end, None])  # softmax
            probs[torch.arange(end - start, device=probs.device), targets[start:end]] -= 1
            grad[start:end, :vocab] = probs * grad_nll[start:end, None]
        return grad, None, None, None


LOSS_CHUNK_ELEMENTS = 2**25  # logits upcast to fp32 at a time by `lm_loss`: 128 MB, ~670 rows of GPT-2's vocabulary


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, *, vocab_size: int, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy (fp32) of `logits` [..., >= vocab_size] over their first
    `vocab_size` columns (`PaddedVocabHead`'s padding never counts). fp32 logits of the exact
    width go to `F.cross_entropy` as they are; others (bf16 under autocast, or padded) through
    `_ChunkedCrossEntropy`, never as a whole fp32 copy: for GPT-2 Small's micro-batch of 16 x 1024
    tokens that copy is 3.3 GB, and `F.cross_entropy` on it would keep as much again for its
    backward (nanoGPT computes it under autocast, which makes the same fp32 copy)."""
    logits, targets = logits.flatten(0, -2), targets.flatten()
    if logits.dtype == torch.float32 and logits.shape[1] == vocab_size:
        return F.cross_entropy(logits, targets, reduction=reduction)
    rows = max(1, LOSS_CHUNK_ELEMENTS // vocab_size)
    nll = _ChunkedCrossEntropy.apply(logits, targets, vocab_size, rows)
    return {"mean": nll.mean, "sum": nll.sum}[reduction]()


def _vocab_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """fp32 cross-entropy over the first `vocab_size` columns, written whole: what `lm_loss_fn`
    compiles, where inductor fuses the slice, the upcast, the log-sum-exp and the gradient into a
    few kernels that read the logits in their own dtype and never store an fp32 copy of them."""
    return F.cross_entropy(logits.flatten(0, -2)[:, :vocab_size].float(), targets.flatten())


def lm_loss_fn(vocab_size: int, *, compile: bool = False) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The training loss of (logits, targets) over `vocab_size` tokens, mean over tokens: `lm_loss`
    (eager, fp32 one chunk of rows at a time), or with `compile` (the run's `compile`) the fused
    fp32 cross-entropy of `torch.compile`: the eager chunked loss is ~280 kernels a micro-batch of
    GPT-2 Small, the compiled one a handful, with the same fp32 arithmetic up to summation order."""
    if compile:
        return functools.partial(torch.compile(_vocab_cross_entropy, dynamic=False), vocab_size=vocab_size)
    return functools.partial(lm_loss, vocab_size=vocab_size)


def flops_per_token(model, context: int) -> float:
    """Training FLOPs per token (forward + backward): 6 N plus attention, N without the
    position embedding (PaLM appendix B; the token embedding counts as the tied output layer)."""
    c = model.config
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    return 6 * n + 12 * c.n_layer * c.n_embd * context


# Dense (no 2:4 sparsity) bf16 tensor-core peaks in TFLOP/s, by a part of the CUDA device name.
# NVIDIA's datasheets quote Hopper's and Blackwell's with sparsity: those are halved here. The first
# match wins, so a name comes before any name it contains ("H100 NVL" before "H100").
PEAK_BF16_TFLOPS = {
    "GB200": 2500.0,  # GB200 NVL72 datasheet, per GPU: FP16/BF16 tensor core 5 PFLOPS with sparsity
    "B200": 2250.0,  # HGX B200 datasheet, per GPU: FP16/BF16 tensor core 4.5 PFLOPS with sparsity
    "H200 NVL": 835.5,  # H200 datasheet, H200 NVL column: BF16 tensor core 1,671 TFLOPS with sparsity
    "H200": 989.0,  # H200 datasheet, H200 SXM column: 1,979 with sparsity
    "H100 NVL": 835.5,  # H100 datasheet, H100 NVL column: BF16 tensor core 1,671 TFLOPS with sparsity
    "H100 PCIe": 756.0,  # H100 PCIe product brief: 1,513 with sparsity
    "H100": 989.0,  # H100 datasheet, H100 SXM column: 1,979 with sparsity
    "H800 PCIe": 756.0,  # the H100 PCIe's tensor cores (an export part: only the interconnect is cut)
    "H800": 989.0,  # the H100 SXM's tensor cores (an export part: only NVLink is cut)
    "A100": 312.0,
    "L40S": 362.0,
    "A6000": 155.0,
    "A10": 125.0,
    "4090": 165.0,
}


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of the GPU named `device_name` (`torch.cuda.get_device_name`); None
    for a GPU not in `PEAK_BF16_TFLOPS`."""
    return next((tflops for key, tflops in PEAK_BF16_TFLOPS.items() if key in device_name), None)


def peak_flops(device: torch.device, configured_tflops: float | None = None) -> float | None:
    """Peak FLOP/s of one device for MFU: `train.peak_tflops` when set, else `peak_tflops` of the
    CUDA device's name; None on the CPU or for an unknown GPU (MFU is then not reported)."""
    if configured_tflops:
        return configured_tflops * 1e12
    if device.type != "cuda":
        return None
    tflops = peak_tflops(torch.cuda.get_device_name(device))
    return None if tflops is None else tflops * 1e12
