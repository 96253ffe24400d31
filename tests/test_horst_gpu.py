"""The CUDA paths of horst and pruning (marker ``gpu``; skipped without a CUDA device, listed as
skipped). ``make gpu-check`` runs these with the benchmarks' ``--device cuda`` runs and writes
``results/bench/gpu.md``.

* The fast path on CUDA (``torch.compile``/Triton) against the plain path and a float64 run, for
  every optimizer, fp32 and bf16 parameters; its one call over all tensors against each tensor
  stepped alone, bit for bit;
* state dicts saved on CUDA load on CPU and back (torch's ``test_cpu_load_state_dict``), and a
  tensor lr on CUDA;
* AC/DC on CUDA: pruned weights stay exactly zero through masked HORST steps and may grow back
  after the restore;
* 2:4 semi-structured sparse matmuls (sm80+) against the same pruned weights dense.
"""

from __future__ import annotations

import pytest
import torch

import horst
import pruning
from horst import _fast_path

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check on a GPU machine)"),
    pytest.mark.filterwarnings("error::RuntimeWarning"),  # a fast path that falls back warns: fail instead
]

CUDA = torch.device("cuda")
OPTIMIZERS = {
    "HORST": lambda ps, fused: horst.HORST(ps, lr=1e-3, weight_decay=0.1, alpha=20.0, beta=0.5, fused=fused),
    "HORST-sm": lambda ps, fused: horst.HORST(ps, lr=1e-3, alpha=20.0, beta=0.5, order="sm", fused=fused),
    "HAM": lambda ps, fused: horst.HAM(ps, lr=1e-3, weight_decay=0.1, fused=fused),
    "HORSTLion": lambda ps, fused: horst.HORSTLion(ps, lr=1e-4, weight_decay=0.1, alpha=20.0, beta=0.5, fused=fused),
    "HORSTSGD": lambda ps, fused: horst.HORSTSGD(ps, lr=1e-2, momentum=0.9, alpha=5.0, beta=0.5, fused=fused),
}
SHAPES = [(1024, 768), (3, 2, 16, 16), (768,), (1, 5)]


def _run(make, dtype: torch.dtype, fused: bool, steps: int = 5) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    initial = [torch.randn(s, generator=generator) * 0.1 for s in SHAPES]
    grads = [[torch.randn(s, generator=generator) * 1e-2 for s in SHAPES] for _ in range(steps)]
    params = [torch.nn.Parameter(t.to(CUDA, dtype)) for t in initial]
    optimizer = make(params, fused)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.to(CUDA, dtype)
        optimizer.step()
    return [t.double() for t in initial], [p.detach().double().cpu() for p in params]


def _relative_error(actual: list[torch.Tensor], expected: list[torch.Tensor], initial: list[torch.Tensor]) -> float:
    """Max over tensors of ||theta - theta_64|| / ||theta_64 - theta_0||: the error relative to the update."""
    return max(((a - e).norm() / (e - i).norm().clamp_min(1e-30)).item() for a, e, i in zip(actual, expected, initial))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_cuda_fast_path_matches_plain_path_and_float64(name, dtype):
    initial, float64 = _run(OPTIMIZERS[name], torch.float64, fused=False)
    _, plain = _run(OPTIMIZERS[name], dtype, fused=False)
    _, fast = _run(OPTIMIZERS[name], dtype, fused=True)
    assert not _fast_path._failed
    plain_error = _relative_error(plain, float64, initial)
    # bf16 rounding of a weight (2**-8 relative) exceeds five small updates: judged against the plain path
    assert _relative_error(fast, float64, initial) <= 2 * plain_error + (1e-3 if dtype == torch.float32 else 5e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_one_compiled_call_over_all_tensors_is_each_tensor_stepped_alone(dtype):
    """The compiled path's one call (small tensors as flat copies, large ones in place) gives each
    tensor bit for bit what the same kernel gives it alone: the step is elementwise."""

    def train(alone: bool) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter((torch.randn(s, generator=generator) * 0.1).to(CUDA, dtype)) for s in SHAPES]
        grads = [[torch.randn(s, generator=generator) * 1e-2 for s in SHAPES] for _ in range(3)]
        optimizers = [OPTIMIZERS["HAM"]([p], True) for p in params] if alone else [OPTIMIZERS["HAM"](params, True)]
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = g.to(CUDA, dtype)
            for optimizer in optimizers:
                optimizer.step()
        return [p.detach().cpu() for p in params]

    for together, alone in zip(train(alone=False), train(alone=True)):
        assert torch.equal(together, alone)
    assert not _fast_path._failed


def test_cuda_state_dict_loads_on_cpu_and_back():
    make = OPTIMIZERS["HORST"]
    cuda_param = torch.nn.Parameter(torch.randn(64, 32, device=CUDA))
    cpu_param = torch.nn.Parameter(cuda_param.detach().cpu().clone())
    cuda_optimizer, cpu_optimizer = make([cuda_param], True), make([cpu_param], True)
    grad = torch.randn(64, 32)
    cuda_param.grad = grad.to(CUDA)
    cuda_optimizer.step()
    cpu_optimizer.load_state_dict(cuda_optimizer.state_dict())
    assert all(t.device.type == "cpu" for s in cpu_optimizer.state.values() for t in s.values() if t.ndim)
    cpu_param.data.copy_(cuda_param.detach().cpu())
    for p, optimizer in ((cuda_param, cuda_optimizer), (cpu_param, cpu_optimizer)):
        p.grad = grad.to(p.device)
        optimizer.step()
    torch.testing.assert_close(cpu_param.detach(), cuda_param.detach().cpu(), rtol=1e-5, atol=1e-6)
    cuda_optimizer.load_state_dict(cpu_optimizer.state_dict())
    assert all(t.device.type == "cuda" for s in cuda_optimizer.state.values() for t in s.values() if t.ndim)


def test_cuda_tensor_lr_equals_float_lr():
    results = []
    for lr in (1e-3, torch.tensor(1e-3, device=CUDA)):
        torch.manual_seed(0)
        param = torch.nn.Parameter(torch.randn(128, 64, device=CUDA))
        optimizer = horst.HORST([param], lr=lr, fused=True)
        for _ in range(3):
            param.grad = torch.ones_like(param) * 1e-2
            optimizer.step()
        results.append(param.detach())
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-7)


def test_cuda_acdc_keeps_pruned_weights_at_zero():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(CUDA)
    weights = {name: p for name, p in model.named_parameters() if p.ndim == 2}
    sparsifier = pruning.Sparsifier(weights)
    optimizer = horst.HORST(model.parameters(), lr=1e-3, fused=True)
    pruned = {name: ~mask for name, mask in sparsifier.prune(0.9).items()}
    x = torch.randn(32, 64, device=CUDA)
    for _ in range(2):
        model(x).square().mean().backward()
        sparsifier.mask_grads_()
        optimizer.step()
        sparsifier.apply_masks_()
        optimizer.zero_grad()
    assert all(int((w.detach()[pruned[name]] != 0).sum()) == 0 for name, w in weights.items())
    sparsifier.restore()
    pruning.reset_optimizer_moments(optimizer, weights)
    model(x).square().mean().backward()
    optimizer.step()
    assert sum(int((w.detach()[pruned[name]] != 0).sum()) for name, w in weights.items()) > 0


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 0), reason="2:4 sparse kernels need sm80+"
)
def test_cuda_semi_structured_matches_dense():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512))
    model = model.to(CUDA, torch.float16)
    weights = {name: p for name, p in model.named_parameters() if p.ndim == 2}
    masks = pruning.nm_masks(weights)
    with torch.no_grad():
        for name, w in weights.items():
            w.mul_(masks[name])
    x = torch.randn(128, 512, device=CUDA, dtype=torch.float16)
    dense = model(x)
    assert len(pruning.to_semi_structured_(model)["converted"]) == 2
    sparse = model(x)
    assert ((sparse - dense).abs().max() / dense.abs().max()).item() < 1e-2


@pytest.mark.parametrize("name", ["HORST", "HAM"])
def test_cuda_step_after_loading_cuda_steps_does_not_sync(name):
    """A state dict whose ``step`` tensors are on CUDA (a fused AdamW checkpoint; torch's
    load_state_dict also moves them there for a group saved with fused=True) loads with its
    steps on the CPU, so no step reads the device (0-d tensors, which the checks above skip)."""
    make = OPTIMIZERS[name]
    params = [torch.nn.Parameter(torch.randn(s, device=CUDA)) for s in SHAPES]
    saved_from = make(params, True)
    for _ in range(2):  # compiles the kernels before the sync check
        for p in params:
            p.grad = torch.randn_like(p)
        saved_from.step()
    saved = saved_from.state_dict()
    for state in saved["state"].values():
        state["step"] = state["step"].to(CUDA)
    optimizer = make(params, True)
    optimizer.load_state_dict(saved)
    assert all(state["step"].device.type == "cpu" for state in optimizer.state.values())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            optimizer.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
