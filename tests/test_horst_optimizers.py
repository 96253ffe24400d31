"""HORST, HAM, HORSTSGD and HORSTLion against plain references written here and against the
optimizers they extend (docs/design.md §2)."""

from __future__ import annotations

import copy
import inspect
import math

import pytest
import torch
from horst_reference import (
    HYPER,
    LRS,
    HamOptimizerWrapper,
    assert_close,
    gradients,
    make_params,
    max_abs_diff,
    reference_ham_step,
    reference_horst_step,
    run,
    run_reference,
)
from timm.optim import Lion

import horst
from horst.mirror import exp_float32

# ------------------------------------------------------------------------------ the tests


def test_exp_float32_matches_exp():
    x = torch.linspace(-87, 88, 200_001)
    relative = (exp_float32(x).double() - torch.exp(x.double())) / torch.exp(x.double())
    assert relative.abs().max().item() < 3e-7
    assert torch.equal(exp_float32(torch.zeros(3)), torch.ones(3))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_horst_with_zero_alpha_beta_is_adamw_bit_for_bit(weight_decay):
    kwargs = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=weight_decay)
    expected, _ = run(lambda ps: torch.optim.AdamW(ps, **kwargs), steps=100, lrs=LRS * 5)
    actual, _ = run(lambda ps: horst.HORST(ps, alpha=0.0, beta=0.0, fused=False, **kwargs), steps=100, lrs=LRS * 5)
    for a, e in zip(actual, expected):
        assert torch.equal(a, e)


@pytest.mark.parametrize("order", ["ms", "sm"])
def test_horst_matches_reference(order):
    hyper = dict(alpha=20.0, beta=0.5, order=order)
    actual, _ = run(
        lambda ps: horst.HORST(
            ps, lr=LRS[0], betas=HYPER["betas"], eps=HYPER["eps"], weight_decay=HYPER["wd"], fused=False, **hyper
        ),
        steps=20,
        lrs=LRS,
    )
    expected = run_reference(reference_horst_step, 20, lrs=LRS, **HYPER, **hyper)
    assert_close(actual, expected)
    # and the mirror step did something: AdamW alone lands elsewhere
    adamw, _ = run(
        lambda ps: torch.optim.AdamW(ps, lr=LRS[0], betas=HYPER["betas"], weight_decay=HYPER["wd"]), steps=20, lrs=LRS
    )
    assert max_abs_diff(actual, adamw) > 1e-3


def test_ham_matches_reference():
    hyper = dict(alpha=200.0, beta=1e-3)  # the authors' defaults
    lrs = [lr / 5 for lr in LRS]  # lr * alpha <= 0.44: larger steps make weights explode
    actual, _ = run(
        lambda ps: horst.HAM(
            ps, lr=lrs[0], betas=HYPER["betas"], eps=HYPER["eps"], weight_decay=HYPER["wd"], fused=False, **hyper
        ),
        steps=20,
        lrs=lrs,
    )
    expected = run_reference(reference_ham_step, 20, lrs=lrs, **HYPER, **hyper)
    assert_close(actual, expected)


@pytest.mark.parametrize("max_norm", [1000.0, 3.0], ids=["default-cap", "cap-acting"])
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "C-kernel"])
def test_ham_matches_the_reference_wrapper(max_norm, fused):
    """HAM against the authors' public wrapper around torch's AdamW (tests/horst_reference.py);
    a cap of 3 acts on two of the three tensors (their norms grow to 5-50 without it)."""
    lrs = [lr / 5 for lr in LRS]
    adamw = dict(lr=lrs[0], betas=HYPER["betas"], eps=HYPER["eps"], weight_decay=HYPER["wd"])
    ours, _ = run(lambda ps: horst.HAM(ps, max_norm=max_norm, fused=fused, **adamw), steps=20, lrs=lrs)
    theirs, _ = run(
        lambda ps: HamOptimizerWrapper(torch.optim.AdamW(ps, **adamw), max_weight_norm=max_norm), steps=20, lrs=lrs
    )
    assert_close(ours, theirs)  # our exp is a polynomial within 2e-7 of torch.exp
    if max_norm == 3.0:
        free, _ = run(lambda ps: horst.HAM(ps, max_norm=None, fused=fused, **adamw), steps=20, lrs=lrs)
        assert sum(f.norm() > 3.0 for f in free) == 2 and all(t.norm() <= 3.0 * (1 + 1e-6) for t in theirs)
    defaults = inspect.signature(HamOptimizerWrapper).parameters
    ham = horst.HAM(make_params()).defaults
    assert (ham["alpha"], ham["beta"], ham["max_norm"]) == tuple(
        defaults[name].default for name in ("alpha", "beta", "max_weight_norm")
    )


def test_ham_clamps_the_exponent_at_5():
    param = torch.nn.Parameter(torch.tensor([[1.0, -1.0, 1.0]]))
    optimizer = horst.HAM([param], lr=0.1, weight_decay=0.0, alpha=1000.0, beta=0.0, fused=False)
    param.grad = torch.tensor([[-1.0, -1.0, 1e-3]])  # lr*alpha*|g| = 100, 100, 0.1
    optimizer.step()
    # AdamW's first step moves each weight by lr * sign(g) (up to eps)
    half = torch.tensor([1.1, -0.9, 0.9])
    expected = half * torch.exp(torch.tensor([5.0, -5.0, -0.1 * 1000 * 1e-3]))
    torch.testing.assert_close(param.detach()[0], expected, rtol=1e-5, atol=0)


def test_hyperbolic_group_key_selects_mirrored_tensors():
    vector = torch.nn.Parameter(torch.ones(4))
    matrix = torch.nn.Parameter(torch.ones(2, 2))
    forced = torch.nn.Parameter(torch.ones(4))
    excluded = torch.nn.Parameter(torch.ones(2, 2))
    optimizer = horst.HORST(
        [
            {"params": [vector, matrix]},
            {"params": [forced], "hyperbolic": True},
            {"params": [excluded], "hyperbolic": False},
        ],
        lr=0.1,
        weight_decay=0.0,
        alpha=0.0,
        beta=1.0,
        fused=False,
    )
    for p in (vector, matrix, forced, excluded):
        p.grad = torch.zeros_like(p)  # u = 0: only beta's shrinkage exp(-lr*beta) can move a weight
    optimizer.step()
    shrunk = math.exp(-0.1 * 1.0)
    assert torch.equal(vector, torch.ones(4))  # 1-D: plain AdamW by default
    assert torch.allclose(matrix, torch.full((2, 2), shrunk))
    assert torch.allclose(forced, torch.full((4,), shrunk))
    assert torch.equal(excluded, torch.ones(2, 2))


def test_lr_scheduler_changes_the_step():
    params = make_params()
    optimizer = horst.HORST(params, lr=1e-2, fused=False)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 0.5**k)
    lrs = []
    for step in range(1, 6):
        for p, g in zip(params, gradients(params, step)):
            p.grad = g
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    actual = [p.detach() for p in params]
    expected = run_reference(
        reference_horst_step, 5, lrs=lrs, betas=(0.9, 0.999), eps=1e-8, wd=1e-2, alpha=10.0, beta=0.1, order="ms"
    )
    assert_close(actual, expected)


def test_closure_is_evaluated_with_grad_enabled():
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    optimizer = horst.HORST([param], lr=0.1, fused=False)

    def closure():
        optimizer.zero_grad()
        loss = (param**2).sum()
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    assert loss.item() == pytest.approx(5.0)
    assert param.grad is not None and not torch.equal(param.detach(), torch.tensor([1.0, -2.0]))


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: horst.HORST(ps, lr=1e-2, alpha=5.0, fused=False),
        lambda ps: horst.HAM(ps, lr=1e-2, fused=False),
        lambda ps: horst.HORSTSGD(ps, lr=1e-2, momentum=0.9, alpha=5.0, beta=0.1),
        lambda ps: horst.HORSTLion(ps, lr=1e-3, alpha=5.0, beta=0.1),
    ],
    ids=["horst", "ham", "sgd", "lion"],
)
def test_state_dict_resume_is_identical_to_uninterrupted_run(make):
    uninterrupted, _ = run(make, steps=12)

    params = make_params()
    optimizer = make(params)
    for step in range(1, 7):
        for p, g in zip(params, gradients(params, step)):
            p.grad = g
        optimizer.step()
    saved_params = copy.deepcopy([p.detach() for p in params])
    saved_state = copy.deepcopy(optimizer.state_dict())

    resumed_params = [torch.nn.Parameter(p.clone()) for p in saved_params]
    resumed = make(resumed_params)
    resumed.load_state_dict(saved_state)
    for step in range(7, 13):
        for p, g in zip(resumed_params, gradients(resumed_params, step)):
            p.grad = g
        resumed.step()
    for a, b in zip(resumed_params, uninterrupted):
        assert torch.equal(a.detach(), b)


def test_state_is_exactly_adamws():
    _, optimizer = run(lambda ps: horst.HORST(ps, fused=False), steps=2)
    for state in optimizer.state.values():
        assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
        assert state["step"].item() == 2
    # an AdamW checkpoint loads into HORST (and back): the state layouts agree
    _, adamw = run(lambda ps: torch.optim.AdamW(ps), steps=2)
    params = make_params()
    horst.HORST(params, fused=False).load_state_dict(adamw.state_dict())


def test_bf16_parameters_track_fp32():
    make = lambda ps: horst.HORST(ps, lr=1e-2, alpha=10.0, beta=0.1, fused=False)  # noqa: E731
    fp32, _ = run(make, steps=10)
    bf16, optimizer = run(make, steps=10, dtype=torch.bfloat16)
    for state in optimizer.state.values():
        assert state["exp_avg"].dtype == torch.bfloat16
    for a, b in zip(bf16, fp32):
        assert a.dtype == torch.bfloat16
        assert torch.allclose(a.float(), b, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(lr=-1.0), "lr"),
        (dict(eps=-1e-8), "eps"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(alpha=-1.0), "alpha"),
        (dict(beta=-0.1), "beta"),
        (dict(betas=(1.0, 0.9)), "betas"),
        (dict(betas=(0.9, -0.1)), "betas"),
        (dict(order="mirror"), "order"),
        (dict(alpha=float("nan")), "alpha"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        horst.HORST(make_params(), **kwargs)
    if name != "order":
        with pytest.raises(ValueError, match=name):
            horst.HAM(make_params(), **kwargs)


def test_invalid_param_group_is_rejected():
    optimizer = horst.HORST(make_params()[:1], fused=False)
    with pytest.raises(ValueError, match="alpha"):
        optimizer.add_param_group({"params": make_params()[1:], "alpha": -1.0})
    with pytest.raises(ValueError, match="hyperbolic"):
        horst.HORST([{"params": make_params(), "hyperbolic": "yes"}])


def test_sgd_with_zero_alpha_beta_is_torch_sgd_bit_for_bit():
    kwargs = dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.1)
    expected, _ = run(lambda ps: torch.optim.SGD(ps, **kwargs), steps=50)
    actual, _ = run(lambda ps: horst.HORSTSGD(ps, alpha=0.0, beta=0.0, **kwargs), steps=50)
    for a, e in zip(actual, expected):
        assert torch.equal(a, e)


def reference_lion(params, steps, *, lr, betas, wd, alpha, beta):
    thetas = [p.detach() for p in params]
    ms = [torch.zeros_like(t) for t in thetas]
    b1, b2 = betas
    for step in range(1, steps + 1):
        for i, (theta, g) in enumerate(zip(thetas, gradients(thetas, step))):
            u = lr * torch.sign(b1 * ms[i] + (1 - b1) * g)
            half = theta * (1 - lr * wd) - u
            a = alpha if theta.ndim >= 2 else 0.0
            b = beta if theta.ndim >= 2 else 0.0
            thetas[i] = half * torch.exp(-a * torch.sign(half) * u - lr * b)
            ms[i] = b2 * ms[i] + (1 - b2) * g
    return thetas


@pytest.mark.parametrize("alpha, beta", [(0.0, 0.0), (20.0, 0.5)])
def test_lion_matches_reference(alpha, beta):
    kwargs = dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    actual, _ = run(lambda ps: horst.HORSTLion(ps, alpha=alpha, beta=beta, **kwargs), steps=20)
    expected = reference_lion(make_params(), 20, lr=1e-3, betas=(0.9, 0.99), wd=0.1, alpha=alpha, beta=beta)
    assert_close(actual, expected)


def test_sgd_mirror_matches_reference():
    lr, alpha, beta = 1e-2, 20.0, 0.5
    actual, _ = run(lambda ps: horst.HORSTSGD(ps, lr=lr, alpha=alpha, beta=beta), steps=20)
    thetas = [p.detach() for p in make_params()]
    for step in range(1, 21):
        for i, (theta, g) in enumerate(zip(thetas, gradients(thetas, step))):
            half = theta - lr * g
            a, b = (alpha, beta) if theta.ndim >= 2 else (0.0, 0.0)
            thetas[i] = half * torch.exp(-a * torch.sign(half) * lr * g - lr * b)
    assert_close(actual, thetas)


# ------------------------------------------------------------------------------ S∘M (order "sm")


def reference_sm_float64(steps, *, lr, betas, eps, wd, alpha, beta):
    """docs/design.md §2.1 in float64: g_m = (1 + alpha |theta|) g (theta before the step),
    theta_new = theta (1 - lr wd) exp(-lr beta) - Adam(g_m, lr); hyperbolic tensors only."""
    thetas = [p.detach().double() for p in make_params()]
    ms = [torch.zeros_like(t) for t in thetas]
    vs = [torch.zeros_like(t) for t in thetas]
    b1, b2 = betas
    for step in range(1, steps + 1):
        for i, (theta, g) in enumerate(zip(thetas, gradients(thetas, step))):
            a, b = (alpha, beta) if theta.ndim >= 2 else (0.0, 0.0)
            g_m = (1 + a * theta.abs()) * g
            ms[i] = b1 * ms[i] + (1 - b1) * g_m
            vs[i] = b2 * vs[i] + (1 - b2) * g_m * g_m
            u = lr * (ms[i] / (1 - b1**step)) / ((vs[i] / (1 - b2**step)).sqrt() + eps)
            thetas[i] = theta * (1 - lr * wd) * math.exp(-lr * b) - u
    return thetas


@pytest.mark.parametrize(
    "dtype, fused",
    [(torch.float64, False), (torch.float32, False), (torch.float32, True)],
    ids=["float64-plain", "float32-plain", "float32-C-kernel"],
)
def test_order_sm_matches_float64_reference_over_30_steps(dtype, fused):
    hyper = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, wd=0.1, alpha=20.0, beta=0.5)
    actual, _ = run(
        lambda ps: horst.HORST(
            ps,
            lr=hyper["lr"],
            betas=hyper["betas"],
            eps=hyper["eps"],
            weight_decay=hyper["wd"],
            alpha=hyper["alpha"],
            beta=hyper["beta"],
            order="sm",
            fused=fused,
        ),
        steps=30,
        dtype=dtype,
    )
    expected = reference_sm_float64(30, **hyper)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-4 * e.abs().max().item())
    # and S∘M is not the parameter-space reorder: "ms" lands elsewhere
    ms, _ = run(
        lambda ps: horst.HORST(ps, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, alpha=20.0, beta=0.5, fused=False),
        steps=30,
        dtype=torch.float64,
    )
    assert max_abs_diff(actual, ms) > 1e-2


# ------------------------------------------------------------------------------ torch conventions


def test_maximize_is_adamw_and_sgd_maximize_bit_for_bit():
    adamw, _ = run(lambda ps: torch.optim.AdamW(ps, lr=1e-2, maximize=True), steps=20)
    ours, _ = run(lambda ps: horst.HORST(ps, lr=1e-2, maximize=True, alpha=0.0, beta=0.0, fused=False), steps=20)
    assert all(torch.equal(a, b) for a, b in zip(adamw, ours))
    kwargs = dict(lr=1e-2, momentum=0.9, dampening=0.2, weight_decay=0.1, maximize=True)
    sgd, _ = run(lambda ps: torch.optim.SGD(ps, **kwargs), steps=20)
    ours, _ = run(lambda ps: horst.HORSTSGD(ps, alpha=0.0, beta=0.0, **kwargs), steps=20)
    assert all(torch.equal(a, b) for a, b in zip(sgd, ours))


def test_complex_parameters_are_adamw_bit_for_bit():
    """torch's AdamW steps a complex parameter as its ``view_as_real``; so does HORST."""
    generator = torch.Generator().manual_seed(0)
    initial = torch.randn(4, 3, dtype=torch.complex64, generator=generator)
    grads = [torch.randn(4, 3, dtype=torch.complex64, generator=generator) for _ in range(10)]
    results = []
    for make in (
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False),
        lambda ps: horst.HORST(ps, lr=1e-2, alpha=0.0, beta=0.0, fused=False),
    ):
        param = torch.nn.Parameter(initial.clone())
        optimizer = make([param])
        for g in grads:
            param.grad = g.clone()
            optimizer.step()
        results.append(param.detach())
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("maximize", [False, True])
def test_lion_with_zero_alpha_beta_is_timm_lion_bit_for_bit(maximize):
    kwargs = dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, maximize=maximize)
    expected, _ = run(lambda ps: Lion(ps, foreach=False, **kwargs), steps=50)
    actual, _ = run(lambda ps: horst.HORSTLion(ps, alpha=0.0, beta=0.0, fused=False, **kwargs), steps=50)
    assert all(torch.equal(a, e) for a, e in zip(actual, expected))


# ------------------------------------------------------------------------------ HAM's guards


@pytest.mark.parametrize("fused", [False, True])
def test_ham_nan_guard_keeps_the_old_weight(fused):
    matrix = torch.nn.Parameter(torch.ones(3, 4))
    vector = torch.nn.Parameter(torch.ones(4))
    optimizer = horst.HAM([matrix, vector], lr=1e-3, fused=fused)
    matrix.grad = torch.full((3, 4), 0.5)
    matrix.grad[1, 2] = float("nan")
    vector.grad = torch.full((4,), float("nan"))
    optimizer.step()
    assert matrix[1, 2].item() == 1.0  # the non-finite step is dropped ...
    others = torch.ones(3, 4, dtype=torch.bool)
    others[1, 2] = False
    assert (matrix.detach()[others] < 1.0).all()  # ... the others step
    assert torch.isnan(vector).all()  # the guard is part of the mirror step: 1-D tensors are plain AdamW
    unguarded = torch.nn.Parameter(torch.ones(3, 4))
    optimizer = horst.HAM([unguarded], lr=1e-3, nan_guard=False, fused=fused)
    unguarded.grad = matrix.grad.clone()
    optimizer.step()
    assert torch.isnan(unguarded[1, 2])


def test_ham_nan_guard_catches_overflow_of_the_mirror_step():
    param = torch.nn.Parameter(torch.tensor([[3e38, 1.0]]))
    optimizer = horst.HAM([param], lr=1.0, weight_decay=0.0, alpha=10.0, beta=0.0, max_norm=None, fused=False)
    param.grad = torch.tensor([[-1.0, -1.0]])  # pulls away from zero: factor exp(5)
    optimizer.step()
    assert param[0, 0].item() == pytest.approx(3e38) and param[0, 1].item() == pytest.approx(2 * math.exp(5))


@pytest.mark.parametrize("fused", [False, True])
def test_ham_norm_cap_rescales_every_parameter_with_a_gradient(fused):
    """As the reference wrapper's ``max_weight_norm``: matrices, vectors, biases alike."""
    make = lambda ps, cap: horst.HAM(ps, lr=1e-2, alpha=20.0, max_norm=cap, fused=fused)  # noqa: E731
    capped, _ = run(lambda ps: make(ps, 2.0), steps=1)
    free, _ = run(lambda ps: make(ps, None), steps=1)
    assert all(f.norm() > 2.0 for f in free)  # so the cap acts on every tensor
    for c, f in zip(capped, free):
        torch.testing.assert_close(c, f * (2.0 / f.norm()))
    untouched, _ = run(lambda ps: make(ps, 100.0), steps=1)
    assert all(torch.equal(u, f) for u, f in zip(untouched, free))  # below the cap: left alone
    assert horst.HAM(make_params()).defaults["max_norm"] == 1000.0
    with pytest.raises(ValueError, match="max_norm"):
        horst.HAM(make_params(), max_norm=-1.0)


# ------------------------------------------------------------------------------ tensor lr, state dicts


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "C-kernel"])
def test_tensor_lr_follows_torch_tensor_lr_arithmetic(fused):
    """torch computes ``1 - lr * weight_decay`` and ``lr / (1 - beta1**step)`` in the tensor lr's
    float32 arithmetic, not in Python floats: so does horst (bit for bit on the plain path)."""
    lr = 0.0123  # a value whose float32 products round differently from double ones
    adamw, _ = run(lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(lr), betas=(0.9, 0.99), weight_decay=0.1), steps=20)
    ours, _ = run(
        lambda ps: horst.HORST(
            ps, lr=torch.tensor(lr), betas=(0.9, 0.99), weight_decay=0.1, alpha=0.0, beta=0.0, fused=fused
        ),
        steps=20,
    )
    as_float, _ = run(
        lambda ps: horst.HORST(ps, lr=lr, betas=(0.9, 0.99), weight_decay=0.1, alpha=0.0, beta=0.0, fused=fused),
        steps=20,
    )
    if fused:
        assert_close(ours, adamw)
    else:
        assert all(torch.equal(a, b) for a, b in zip(ours, adamw))
        assert not all(torch.equal(a, b) for a, b in zip(as_float, adamw))  # so the test can tell
    sgd_kwargs = dict(momentum=0.9, weight_decay=0.1)
    sgd, _ = run(lambda ps: torch.optim.SGD(ps, lr=torch.tensor(lr), **sgd_kwargs), steps=20)
    ours, _ = run(
        lambda ps: horst.HORSTSGD(ps, lr=torch.tensor(lr), alpha=0.0, beta=0.0, fused=fused, **sgd_kwargs), steps=20
    )
    assert_close(ours, sgd, tol=0 if not fused else 1e-6)


def _stepped(make, params):
    optimizer = make(params)
    for step in range(1, 3):
        for p, g in zip(params, gradients(params, step)):
            p.grad = g
        optimizer.step()
    return optimizer


def test_load_state_dict_keeps_this_optimizers_implementation_flags():
    """An AdamW(foreach=True) checkpoint loads into HORST and steps: the checkpoint's foreach=True
    does not replace this optimizer's own implementation flags."""
    saved = _stepped(lambda ps: torch.optim.AdamW(ps, foreach=True, fused=None), make_params()).state_dict()
    params = make_params()
    optimizer = horst.HORST(params, fused=False)
    optimizer.load_state_dict(saved)
    group = optimizer.param_groups[0]
    assert (group["foreach"], group["fused"], group["capturable"], group["differentiable"]) == (
        None,
        False,
        False,
        False,
    )
    for p, g in zip(params, gradients(params, 3)):
        p.grad = g
    optimizer.step()
    assert all(state["step"].item() == 3 for state in optimizer.state.values())
    fused = horst.HAM(make_params(), fused=True)
    fused.load_state_dict(_stepped(lambda ps: horst.HAM(ps, fused=False), make_params()).state_dict())
    assert fused.param_groups[0]["fused"] is True
    assert saved["param_groups"][0]["foreach"] is True  # the state dict itself is left alone


@pytest.mark.parametrize("cls", [horst.HORST, horst.HAM, horst.HORSTLion, horst.HORSTSGD])
def test_load_state_dict_checks_every_state_tensor_before_any_change(cls):
    """A state dict saved with the parameters in another order (same group sizes) is refused,
    naming the parameter, before any state is broadcast onto a parameter of another shape, updated
    or counted."""
    kwargs = {"momentum": 0.9} if cls is horst.HORSTSGD else {}
    make = lambda ps: cls(ps, fused=False, **kwargs)  # noqa: E731
    saved = _stepped(make, make_params()).state_dict()
    params = make_params()
    reordered = [params[1], params[0], params[2]]  # shapes (5,), (6, 5), (3, 2, 4)
    optimizer = make(reordered)
    with pytest.raises(
        ValueError, match=r"of param_groups\[0\]\['params'\]\[0\] has shape \(6, 5\), its parameter \(5,\)"
    ):
        optimizer.load_state_dict(saved)
    assert not optimizer.state
    name = next(n for n in saved["state"][2] if n != "step")
    saved["state"][2][name] = saved["state"][2][name].to(torch.int64)
    with pytest.raises(ValueError, match=rf"{name}' of param_groups\[0\]\['params'\]\[2\] is torch.int64"):
        make(params).load_state_dict(saved)


class StepOnAnAccelerator(torch.Tensor):
    """A step tensor as if on an accelerator, where reading it on the host syncs: it says its
    device is CUDA and counts its reads (``item``, ``float``, ...) and its moves to the CPU."""

    reads = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func == torch.Tensor.device.__get__:
            return torch.device("cuda")
        if func in (torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.tolist):
            cls.reads += 1
        if func in (torch.Tensor.cpu, torch.Tensor.to):  # a move to the CPU: one read, a plain tensor
            cls.reads += 1
            with torch._C.DisableTorchFunctionSubclass():
                return args[0].clone()
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("cls", [horst.HORST, horst.HAM])
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "C-kernel"])
def test_step_loaded_on_an_accelerator_is_read_once_not_at_every_step(cls, fused):
    """A state dict whose steps are on an accelerator (a fused AdamW checkpoint, or torch's
    load_state_dict moving them for a group saved with fused=True) is moved to the CPU once, at
    load, not read on the host (a device sync) once per parameter per step."""
    saved = _stepped(lambda ps: cls(ps, fused=fused), make_params()).state_dict()
    for state in saved["state"].values():
        state["step"] = state["step"].as_subclass(StepOnAnAccelerator)
    params = make_params()
    optimizer = cls(params, fused=fused)
    StepOnAnAccelerator.reads = 0
    optimizer.load_state_dict(saved)
    assert StepOnAnAccelerator.reads <= len(params)
    for step in range(3, 6):
        for p, g in zip(params, gradients(params, step)):
            p.grad = g
        optimizer.step()
    assert StepOnAnAccelerator.reads <= len(params)
    assert all(type(state["step"]) is torch.Tensor and state["step"].item() == 5 for state in optimizer.state.values())
