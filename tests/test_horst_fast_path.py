"""The fast paths against the plain path and the float32 reference: the C kernel (contiguous
float32 on CPU) and the torch.compile kernel (everything else; CUDA's path, checked here on
CPU).

Compiling costs seconds per graph (one per order and dtype), so everything that needs the
compiled path is checked in this one module.
"""

from __future__ import annotations

import re

import pytest
import torch

import horst
from horst import _cpu_kernel, _fast_path
from horst.mirror import EXP_POLY
from horst_reference import HYPER, LRS, assert_close, reference_ham_step, reference_horst_step, run, run_reference

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # a silent fallback would pass


def horst_factory(order, fused, alpha=20.0, beta=0.5):
    return lambda ps: horst.HORST(
        ps, lr=LRS[0], betas=HYPER["betas"], eps=HYPER["eps"], weight_decay=HYPER["wd"],
        alpha=alpha, beta=beta, order=order, fused=fused,
    )  # fmt: skip


@pytest.fixture(params=["C kernel", "compiled"])
def fast_path(request, monkeypatch):
    """Runs the test on one fast path and checks that it, and only it, did the work."""
    calls = {"C kernel": 0, "compiled": 0}
    kernel, compiled = _cpu_kernel.mirror_step_f32_, _fast_path._compiled_kernel()

    def count(name, function):
        def counted(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        return counted

    monkeypatch.setattr(_cpu_kernel, "mirror_step_f32_", count("C kernel", kernel))
    monkeypatch.setattr(_fast_path, "_compiled_kernel", lambda: count("compiled", compiled))
    if request.param == "compiled":  # as on CUDA
        monkeypatch.setattr(_cpu_kernel, "supports", lambda tensors: False)
    yield request.param
    assert calls[request.param] > 0
    assert sum(calls.values()) == calls[request.param]


@pytest.mark.parametrize("order", ["ms", "sm"])
def test_fast_path_matches_reference_and_plain_path(order, fast_path):
    fast, _ = run(horst_factory(order, fused=True), steps=20, lrs=LRS)
    plain, _ = run(horst_factory(order, fused=False), steps=20, lrs=LRS)
    reference = run_reference(reference_horst_step, 20, lrs=LRS, **HYPER, alpha=20.0, beta=0.5, order=order)
    assert_close(fast, reference)
    assert_close(fast, plain)


def test_ham_fast_path_matches_reference(fast_path):
    lrs = [lr / 5 for lr in LRS]
    make = lambda ps: horst.HAM(ps, lr=lrs[0], betas=HYPER["betas"], eps=HYPER["eps"],  # noqa: E731
                                weight_decay=HYPER["wd"], fused=True)  # fmt: skip
    fast, _ = run(make, steps=20, lrs=lrs)
    reference = run_reference(reference_ham_step, 20, lrs=lrs, **HYPER, alpha=200.0, beta=1e-3)
    assert_close(fast, reference)


def test_fast_path_without_mirror_is_adamw(fast_path):
    adamw, _ = run(lambda ps: torch.optim.AdamW(ps, lr=LRS[0], betas=HYPER["betas"], weight_decay=HYPER["wd"]),
                   steps=50, lrs=LRS * 3)  # fmt: skip
    fast, _ = run(horst_factory("ms", fused=True, alpha=0.0, beta=0.0), steps=50, lrs=LRS * 3)
    # not bit for bit: the fused kernels round the division and lerp differently from ATen's
    assert_close(fast, adamw)


def test_fast_path_bf16():
    fp32, _ = run(horst_factory("ms", fused=True), steps=10, lrs=LRS)
    bf16, optimizer = run(horst_factory("ms", fused=True), steps=10, lrs=LRS, dtype=torch.bfloat16)
    assert all(s["exp_avg_sq"].dtype == torch.bfloat16 for s in optimizer.state.values())
    for a, b in zip(bf16, fp32):
        torch.testing.assert_close(a.float(), b, atol=3e-2, rtol=3e-2)


def _layouts(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The same values as a contiguous tensor, a transposed (dense, permuted) one, and a
    strided slice of a larger tensor (not dense)."""
    transposed = tensor.t().contiguous().t()
    sliced = torch.zeros(tensor.shape[0], 2 * tensor.shape[1])[:, ::2]
    sliced.copy_(tensor)
    return [tensor.clone(), transposed, sliced]


@pytest.mark.parametrize("optimizer", ["horst_ms", "horst_sm", "ham"])
def test_cpu_kernel_on_large_tensors_over_threads(optimizer):
    """Tensors of many blocks (split over OpenMP threads), sizes that leave vector tails, a
    1-D one (no mirror step), and the same matrix in three memory layouts (contiguous and
    transposed: the C kernel; a strided slice: the plain path) in one param group."""
    generator = torch.Generator().manual_seed(0)
    make = {
        "horst_ms": lambda ps, fused: horst.HORST(ps, lr=1e-2, alpha=20.0, beta=0.5, fused=fused),
        "horst_sm": lambda ps, fused: horst.HORST(ps, lr=1e-2, alpha=20.0, beta=0.5, order="sm", fused=fused),
        # lr * alpha = 0.4, not 2: an exponent of 2 g with g ~ N(0, 1) sends weights through zero,
        # where the sign of a rounding difference decides the factor (e^x or e^-x), on any path
        "ham": lambda ps, fused: horst.HAM(ps, lr=2e-3, alpha=200.0, beta=1e-3, fused=fused),
    }[optimizer]
    initial = [torch.randn(100_003, generator=generator), torch.randn(257, 389, generator=generator)]
    grads = [[torch.randn(t.shape, generator=generator) for t in initial] for _ in range(5)]
    results = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for fused in (True, False):
            params = [torch.nn.Parameter(initial[0].clone())]
            params += [torch.nn.Parameter(t) for t in _layouts(initial[1])]
            assert [p.is_contiguous() for p in params] == [True, True, False, False]
            opt = make(params, fused)
            for vector_grad, matrix_grad in grads:
                params[0].grad = vector_grad.clone()
                for p, g in zip(params[1:], _layouts(matrix_grad)):
                    p.grad = g
                opt.step()
            results[fused] = [p.detach().clone() for p in params]
    finally:
        torch.set_num_threads(threads)
    assert_close(results[True], results[False])
    fast = results[True]
    assert not torch.equal(fast[1], initial[1])
    assert torch.equal(fast[1], fast[2])  # the C kernel, whatever the memory order


def test_cpu_kernel_polynomial_is_mirrors():
    source = _cpu_kernel.SOURCE.read_text()
    defined = [float(value) for value in re.findall(r"#define EXP_C[2-5] ([0-9.e-]+)f", source)]
    assert defined == list(EXP_POLY)


def test_cpu_kernel_build_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HORST_CACHE_DIR", str(tmp_path))
    first = _cpu_kernel.build()
    built = first.stat().st_mtime_ns
    assert _cpu_kernel.build() == first and first.stat().st_mtime_ns == built
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary left behind


def test_cpu_kernel_build_failure_falls_back_loudly(tmp_path, monkeypatch):
    monkeypatch.setenv("HORST_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setattr(_fast_path, "_failed", set())
    _cpu_kernel._kernel.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="C kernel fast path failed.*no C compiler 'no-such-compiler'"):
            fast, _ = run(horst_factory("ms", fused=True), steps=3, lrs=LRS)
    finally:
        _cpu_kernel._kernel.cache_clear()  # later tests load the real build again
    plain, _ = run(horst_factory("ms", fused=False), steps=3, lrs=LRS)
    assert_close(fast, plain)
