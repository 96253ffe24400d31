"""GPT-2 on a GPU: padded logits, the loss without an fp32 copy of the logits, evaluation that
does not wait for the device, the clock of MFU, and the peak table. Each CUDA check has a CPU
stand-in beside it."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from horst_sparse.gpt2 import model as gpt2_model
from horst_sparse.gpt2.evaluate import _summed_nll, evaluate_lm
from horst_sparse.gpt2.model import (
    VOCAB_SIZE,
    PaddedVocabHead,
    build_model,
    lm_loss,
    lm_loss_fn,
    peak_flops,
    peak_tflops,
)
from horst_sparse.gpt2.run import seconds_since

NANO = OmegaConf.create(
    dict(arch="gpt2", name="n", n_layer=1, n_head=2, n_embd=16, n_positions=16, dropout=0.0, tie_word_embeddings=True)
)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check on a GPU machine)")


def test_padded_logits_are_50304_wide_and_change_neither_weights_nor_loss():
    torch.manual_seed(0)
    plain = build_model(NANO)
    torch.manual_seed(0)
    padded = build_model(NANO, vocab_multiple=64)
    assert isinstance(padded.lm_head, PaddedVocabHead) and padded.lm_head.weight is padded.transformer.wte.weight
    # The same parameters, drawn alike: checkpoints and exports see GPT-2's 50257 tokens.
    assert padded.state_dict().keys() == plain.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(padded.state_dict().values(), plain.state_dict().values()))

    tokens = torch.randint(VOCAB_SIZE, (2, 9))
    logits = padded(tokens[:, :-1]).logits
    assert logits.shape[-1] == 50304 and not logits[..., VOCAB_SIZE:].any()  # zero rows: logit 0, never counted
    reference = F.cross_entropy(plain(tokens[:, :-1]).logits.flatten(0, 1), tokens[:, 1:].flatten())
    assert lm_loss(logits, tokens[:, 1:], vocab_size=VOCAB_SIZE).item() == pytest.approx(reference.item(), rel=1e-6)

    stream = np.random.default_rng(0).integers(VOCAB_SIZE, size=100).astype(np.uint16)
    kwargs = dict(context=16, batch_size=4, device=torch.device("cpu"))
    assert evaluate_lm(padded, stream, **kwargs)["loss"] == pytest.approx(evaluate_lm(plain, stream, **kwargs)["loss"])
    assert build_model(NANO, vocab_size=128, vocab_multiple=64).lm_head.__class__ is torch.nn.Linear  # a multiple


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_loss_is_fp32_cross_entropy_of_the_unpadded_logits_and_its_gradient(dtype, monkeypatch):
    monkeypatch.setattr(gpt2_model, "LOSS_CHUNK_ELEMENTS", 7 * 100)  # chunks of 7 rows, the last one short
    torch.manual_seed(0)
    logits = (3 * torch.randn(3, 11, 128)).to(dtype).requires_grad_()
    targets = torch.randint(100, (3, 11))
    loss = lm_loss(logits, targets, vocab_size=100)
    loss.backward()
    exact = logits.detach().double().requires_grad_()
    reference = F.cross_entropy(exact[..., :100].flatten(0, 1), targets.flatten())
    reference.backward()
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(reference.item(), rel=1e-6)
    assert logits.grad.dtype == dtype and not logits.grad[..., 100:].any()
    tolerance = 1e-7 if dtype == torch.float32 else 2e-2 * exact.grad.abs().max().item()  # bf16's rounding of it
    torch.testing.assert_close(logits.grad.double(), exact.grad, atol=tolerance, rtol=0)
    summed = lm_loss(logits.detach(), targets, vocab_size=100, reduction="sum")
    assert summed.item() == pytest.approx(33 * reference.item(), rel=1e-6)


def test_the_loss_of_bf16_logits_keeps_no_fp32_copy_of_them():
    """The CPU stand-in of the CUDA memory check below: every tensor autograd saves for the
    backward pass, with and without this loss."""
    logits = torch.randn(64, 1000, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(1000, (64,))

    def saved_fp32_elements(loss_fn) -> int:
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            loss_fn()
        return sum(t.numel() for t in saved if t.dtype == torch.float32)

    assert saved_fp32_elements(lambda: F.cross_entropy(logits.float(), targets)) >= logits.numel()  # the old way
    assert saved_fp32_elements(lambda: lm_loss(logits, targets, vocab_size=1000)) == 64  # one log-sum-exp a row


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("compile", [False, True])  # lm_loss, and the compiled loss of a run with compile=true
def test_gpt2_small_loss_on_cuda_peaks_far_below_an_fp32_copy_of_its_logits(compile):
    device = torch.device("cuda")
    logits = torch.randn(16 * 1024, 50304, device=device, dtype=torch.bfloat16, requires_grad=True)  # 1.6 GB
    targets = torch.randint(VOCAB_SIZE, (16 * 1024,), device=device)
    loss_fn = lm_loss_fn(VOCAB_SIZE, compile=compile)
    loss_fn(logits, targets).backward()  # compiles
    logits.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss_fn(logits, targets).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    # The gradient (bf16, as large as the logits) and a few fp32 chunks; the fp32 copy alone was 3.3 GB.
    assert extra < logits.numel() * 2 + 8 * gpt2_model.LOSS_CHUNK_ELEMENTS * 4
    exact = F.cross_entropy(logits.detach()[:, :VOCAB_SIZE].float(), targets)
    assert loss_fn(logits.detach(), targets).item() == pytest.approx(exact.item(), rel=1e-5)


def test_evaluation_sums_fp32_nll_and_counts_tokens_on_cpu():
    """The CPU stand-in of the CUDA check below: the summed loss and the token count."""
    model = build_model(NANO, vocab_size=100).eval()
    windows = [np.arange(i, i + 17) % 100 for i in range(3)]
    totals = _summed_nll(model, windows, torch.device("cpu"), torch.float32)
    batch = torch.from_numpy(np.stack(windows).astype(np.int64))
    with torch.no_grad():
        reference = F.cross_entropy(model(batch[:, :-1]).logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
    assert totals.dtype == torch.float64 and totals.tolist() == [reference.double().item(), 48.0]


@pytest.mark.gpu
@cuda
def test_evaluation_batches_reach_the_gpu_without_a_synchronizing_copy():
    device = torch.device("cuda")
    model = build_model(NANO, vocab_multiple=64).to(device).eval()
    windows = [np.arange(i, i + 17).astype(np.uint16) for i in range(4)]
    torch.cuda.set_sync_debug_mode("error")  # a blocking copy, as .to(device) of pageable memory, raises
    try:
        totals = _summed_nll(model, windows, device, torch.bfloat16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert totals[1].item() == 64


class _Sleepy:
    def __init__(self, seconds: float) -> None:
        self.seconds, self.calls = seconds, 0

    def __call__(self, device=None) -> None:
        self.calls += 1
        time.sleep(self.seconds)  # the kernels still queued on the device


def test_a_log_steps_clock_is_read_after_the_device_finished(monkeypatch):
    """The CPU stand-in: `torch.cuda.synchronize` replaced by a wait; no CUDA is touched."""
    synchronize = _Sleepy(0.05)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    started = time.time()
    assert seconds_since(started, torch.device("cuda"), synchronize=True) >= 0.05 and synchronize.calls == 1
    assert seconds_since(started, torch.device("cuda"), synchronize=False) >= 0.05 and synchronize.calls == 1
    assert seconds_since(time.time(), torch.device("cpu"), synchronize=True) < 0.05 and synchronize.calls == 1


@pytest.mark.gpu
@cuda
def test_a_log_steps_clock_counts_the_queued_kernels():
    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)
    torch.cuda.synchronize()
    done = torch.cuda.Event(enable_timing=True)
    begin = torch.cuda.Event(enable_timing=True)
    started = time.time()
    begin.record()
    for _ in range(50):
        a = a @ a / 64
    done.record()
    seconds = seconds_since(started, device, synchronize=True)
    assert seconds >= begin.elapsed_time(done) / 1000


def test_peak_table_names_each_gpu_by_its_datasheet():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0  # SXM
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H100 NVL") == 835.5  # 1,671 with sparsity, not the SXM's 989
    assert peak_tflops("NVIDIA H200") == 989.0 and peak_tflops("NVIDIA H200 NVL") == 835.5
    assert peak_tflops("NVIDIA H800") == 989.0 and peak_tflops("NVIDIA H800 PCIe") == 756.0
    assert peak_tflops("NVIDIA B200") == 2250.0 and peak_tflops("NVIDIA GB200") == 2500.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0 and peak_tflops("Tesla T4") is None
    assert peak_flops(torch.device("cpu")) is None and peak_flops(torch.device("cpu"), 100.0) == 100e12
