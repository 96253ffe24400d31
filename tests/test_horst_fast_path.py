"""The torch.compile fast path against the plain path and the float32 reference.

Compiling costs seconds per graph (one per order and dtype), so everything that needs the
fast path is checked in this one module.
"""

from __future__ import annotations

import pytest
import torch

import horst
from horst_reference import HYPER, LRS, assert_close, reference_ham_step, reference_horst_step, run, run_reference

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # a silent fallback would pass


def horst_factory(order, fused, alpha=20.0, beta=0.5):
    return lambda ps: horst.HORST(
        ps, lr=LRS[0], betas=HYPER["betas"], eps=HYPER["eps"], weight_decay=HYPER["wd"],
        alpha=alpha, beta=beta, order=order, fused=fused,
    )  # fmt: skip


@pytest.mark.parametrize("order", ["ms", "sm"])
def test_fast_path_matches_reference_and_plain_path(order):
    fast, _ = run(horst_factory(order, fused=True), steps=20, lrs=LRS)
    plain, _ = run(horst_factory(order, fused=False), steps=20, lrs=LRS)
    reference = run_reference(reference_horst_step, 20, lrs=LRS, **HYPER, alpha=20.0, beta=0.5, order=order)
    assert_close(fast, reference)
    assert_close(fast, plain)


def test_ham_fast_path_matches_reference():
    lrs = [lr / 5 for lr in LRS]
    make = lambda ps: horst.HAM(ps, lr=lrs[0], betas=HYPER["betas"], eps=HYPER["eps"],  # noqa: E731
                                weight_decay=HYPER["wd"], fused=True)  # fmt: skip
    fast, _ = run(make, steps=20, lrs=lrs)
    reference = run_reference(reference_ham_step, 20, lrs=lrs, **HYPER, alpha=200.0, beta=1e-3)
    assert_close(fast, reference)


def test_fast_path_without_mirror_is_adamw():
    adamw, _ = run(lambda ps: torch.optim.AdamW(ps, lr=LRS[0], betas=HYPER["betas"], weight_decay=HYPER["wd"]),
                   steps=50, lrs=LRS * 3)  # fmt: skip
    fast, _ = run(horst_factory("ms", fused=True, alpha=0.0, beta=0.0), steps=50, lrs=LRS * 3)
    # not bit for bit: inductor's lerp and division round differently from ATen's kernels
    assert_close(fast, adamw)


def test_fast_path_bf16():
    fp32, _ = run(horst_factory("ms", fused=True), steps=10, lrs=LRS)
    bf16, optimizer = run(horst_factory("ms", fused=True), steps=10, lrs=LRS, dtype=torch.bfloat16)
    assert all(s["exp_avg_sq"].dtype == torch.bfloat16 for s in optimizer.state.values())
    for a, b in zip(bf16, fp32):
        torch.testing.assert_close(a.float(), b, atol=3e-2, rtol=3e-2)
