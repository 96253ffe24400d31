"""The toy implicit-bias experiment (scripts/toy_implicit_bias.py, docs/design.md §2.4) on a
small instance: the references are right, and GD, HAM over GD and HORST land where theory
says; order "sm" (the paper's S∘M) loses HORST's L1 bias."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

import horst
from scripts import toy_implicit_bias as toy

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "toy_implicit_bias.py"

HAM_ALPHA = 10.0
HORST_LR = 0.01
HORST_STEPS = 1000
HORST_ALPHAS = (10.0, 100.0, 300.0)
# S∘M against "ms": the script's default step (lr 0.003), long enough to settle
ORDER_LR = 0.003
ORDER_STEPS = 2000


@pytest.fixture(scope="module")
def problem():
    return toy.make_problem(n=20, d=50, k=3, seed=0)


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def ham_over_gd(init: float):
    return toy.Method(
        "HAM over GD",
        "HAM-GD",
        lambda p: horst.HORSTSGD(p, lr=0.02, alpha=HAM_ALPHA, beta=0.0),
        toy.linear_warmup(5e-4, 0.02, 1000),
        20000,
        init=init,
        hyperbolic=True,
        stop_at_interpolation=True,
    )


def horst_run(problem, *, alpha: float, beta: float, order: str, lr: float = HORST_LR, steps: int = HORST_STEPS):
    method = toy.Method(
        "HORST",
        "HORST",
        lambda p: horst.HORST(p, lr=lr, alpha=alpha, beta=beta, order=order, weight_decay=0.0, fused=False),
        toy.cosine(lr, steps),
        steps,
        hyperbolic=True,
    )
    return toy.train(problem, method)


# ----------------------------------------------------------------------------- references


def test_min_l1_reference_matches_a_second_lp(problem):
    theta = toy.min_l1_interpolant(problem.X, problem.y)
    n, d = problem.X.shape
    # min sum(t) over (theta, t) with -t <= theta <= t, X theta = y
    eye = np.eye(d)
    result = linprog(
        np.r_[np.zeros(d), np.ones(d)],
        A_ub=np.block([[eye, -eye], [-eye, -eye]]),
        b_ub=np.zeros(2 * d),
        A_eq=np.hstack([problem.X, np.zeros((n, d))]),
        b_eq=problem.y,
        bounds=[(None, None)] * d + [(0, None)] * d,
        method="highs",
    )
    assert result.success
    assert np.abs(theta).sum() == pytest.approx(result.fun, rel=1e-9)
    assert np.linalg.norm(problem.X @ theta - problem.y) < 1e-10
    assert np.abs(theta).sum() < np.abs(toy.min_l2_interpolant(problem.X, problem.y)).sum()


@pytest.mark.parametrize("theta0", [0.0, 0.05])
@pytest.mark.parametrize("alpha", [1.0, 10.0, 300.0])
def test_r_alpha_reference_satisfies_kkt(problem, alpha, theta0):
    """argmin R(theta) - <grad R(theta0), theta> s.t. X theta = y  <=>  X theta = y and
    grad R(theta) - grad R(theta0) in the row space of X (convex problem)."""
    theta = toy.hyperbolic_entropy_interpolant(problem.X, problem.y, alpha, theta0)
    assert np.linalg.norm(problem.X @ theta - problem.y) < 1e-10
    mirror = np.sign(theta) * np.log1p(alpha * np.abs(theta)) / alpha
    v = mirror - np.log1p(alpha * theta0) / alpha
    X = problem.X
    off_row_space = v - X.T @ np.linalg.solve(X @ X.T, X @ v)
    assert np.linalg.norm(off_row_space) < 1e-8 * np.linalg.norm(v)


def test_r_alpha_reference_has_the_smallest_r_alpha_among_interpolants(problem):
    alpha = 10.0
    theta = toy.hyperbolic_entropy_interpolant(problem.X, problem.y, alpha)
    best = toy.hyperbolic_entropy(theta, alpha)
    others = [toy.min_l2_interpolant(problem.X, problem.y), toy.min_l1_interpolant(problem.X, problem.y)]
    _, _, vt = np.linalg.svd(problem.X)
    null_space = vt[problem.X.shape[0] :].T
    rng = np.random.default_rng(1)
    others += [theta + null_space @ rng.standard_normal(null_space.shape[1]) * s for s in (1e-3, 1e-1)]
    for other in others:
        assert np.linalg.norm(problem.X @ other - problem.y) < 1e-9
        assert toy.hyperbolic_entropy(other, alpha) > best


def test_r_alpha_reference_goes_from_min_l2_to_min_l1(problem):
    l2 = toy.min_l2_interpolant(problem.X, problem.y)
    l1 = toy.min_l1_interpolant(problem.X, problem.y)
    assert rel(toy.hyperbolic_entropy_interpolant(problem.X, problem.y, 1e-4), l2) < 1e-3
    assert rel(toy.hyperbolic_entropy_interpolant(problem.X, problem.y, 1e6), l1) < 0.05
    norms = [np.abs(toy.hyperbolic_entropy_interpolant(problem.X, problem.y, a)).sum() for a in (1, 10, 100)]
    assert norms[0] > norms[1] > norms[2]


# ----------------------------------------------------------------------------- optimizers


def test_gd_lands_on_min_l2(problem):
    lr = 1.0 / np.linalg.norm(problem.X, 2) ** 2
    method = toy.Method(
        "GD", "GD", lambda p: torch.optim.SGD(p, lr=lr), lambda _: lr, 20000, stop_at_interpolation=True
    )
    run = toy.train(problem, method)
    assert run.steps < 20000
    assert rel(run.theta, toy.min_l2_interpolant(problem.X, problem.y)) < 1e-6


def test_ham_over_gd_lands_on_argmin_r_alpha(problem):
    run = toy.train(problem, ham_over_gd(init=0.0))
    reference = toy.hyperbolic_entropy_interpolant(problem.X, problem.y, HAM_ALPHA)
    assert run.residual < 1e-9
    assert rel(run.theta, reference) < 1e-2
    # and the reference is far from GD's answer, so the match says something
    assert rel(run.theta, toy.min_l2_interpolant(problem.X, problem.y)) > 0.1


def test_ham_over_gd_from_uniform_init_minimises_the_bregman_divergence(problem):
    init = 0.05
    run = toy.train(problem, ham_over_gd(init=init))
    bregman = toy.hyperbolic_entropy_interpolant(problem.X, problem.y, HAM_ALPHA, init)
    from_zero = toy.hyperbolic_entropy_interpolant(problem.X, problem.y, HAM_ALPHA, 0.0)
    assert rel(run.theta, bregman) < 1e-2
    assert rel(run.theta, from_zero) > 0.1


@pytest.fixture(scope="module")
def horst_runs(problem):
    """HORST (beta = 1, order "ms") over HORST_ALPHAS."""
    return [horst_run(problem, alpha=a, beta=1.0, order="ms") for a in HORST_ALPHAS]


@pytest.fixture(scope="module")
def horst_sweep(horst_runs):
    return {"ms": [np.abs(run.theta).sum() for run in horst_runs]}


def test_horst_l1_falls_as_alpha_grows(problem, horst_runs, horst_sweep):
    l1 = horst_sweep["ms"]
    assert l1[0] > l1[1] > l1[2], l1
    assert l1[2] < 0.75 * l1[0]
    # near-interpolants, not solutions shrunk towards 0 by beta
    for run in horst_runs:
        assert run.residual < 1e-2 * np.linalg.norm(problem.y)


def test_horst_without_beta_has_no_l1_trend(problem):
    """docs/design.md §2.1: the L1 bias needs beta > 0; with beta = 0 the largest alpha is denser."""
    smallest, largest = HORST_ALPHAS[0], HORST_ALPHAS[-1]
    l1 = [np.abs(horst_run(problem, alpha=a, beta=0.0, order="ms").theta).sum() for a in (smallest, largest)]
    assert l1[1] > l1[0], l1


def test_order_sm_loses_the_l1_bias(problem):
    """docs/design.md §2.1: S∘M (Adam of the mirror-scaled gradient) keeps AdamW's L1 norm, within
    15 %, at every alpha, while "ms" falls below 60 % of it. AdamW here is HORST with alpha = 0:
    AdamW with beta's decay, the same explicit shrinkage as both orders."""
    adamw = np.abs(horst_run(problem, alpha=0.0, beta=1.0, order="ms", lr=ORDER_LR, steps=ORDER_STEPS).theta).sum()
    l1 = {
        order: [
            np.abs(horst_run(problem, alpha=a, beta=1.0, order=order, lr=ORDER_LR, steps=ORDER_STEPS).theta).sum()
            for a in (100.0, 300.0)
        ]
        for order in ("ms", "sm")
    }
    assert all(abs(value / adamw - 1) < 0.15 for value in l1["sm"]), (adamw, l1)
    assert min(l1["ms"]) < 0.6 * adamw, (adamw, l1)


# ----------------------------------------------------------------------------- script


def test_script_writes_table_and_plot(tmp_path):
    argv = ["--n", "8", "--d", "16", "--k", "2", "--steps", "100", "--max-steps", "2000"]
    argv += ["--alphas", "0", "30"]
    argv += ["--out", str(tmp_path)]
    result = toy.main(argv)
    table = (tmp_path / "table.md").read_text()
    assert "python scripts/toy_implicit_bias.py --n 8 --d 16" in table
    for name in ("GD", "HAM over GD", "Adam", "AdamW", "HORST (alpha=30", "HORST-sm (alpha=0", "min-L1"):
        assert name in table
    assert len(result["runs"]) == 8
    assert (tmp_path / "implicit_bias.png").stat().st_size > 10_000


def test_script_rejects_an_overdetermined_problem(capsys):
    with pytest.raises(SystemExit):
        toy.parse_args(["--n", "50", "--d", "20"])
    assert "underdetermined" in capsys.readouterr().err
