"""Toy implicit-bias experiment: which interpolant does each optimizer pick? (docs/design.md §2.4)

    python scripts/toy_implicit_bias.py --out results/toy    # the committed table (default --out: outputs/toy)
    python scripts/toy_implicit_bias.py --n 20 --d 50 --k 3 --alphas 10 100 300 --out /tmp/toy

Underdetermined least squares ``L(theta) = 0.5 * ||X theta - y||^2`` with ``X`` of shape
``n x d`` (n < d, entries N(0, 1/n)), a k-sparse ground truth and ``y = X theta_star``. Every
method trains on the full batch, in float64, from ``theta0 = 0`` (see "Initialisation"), and
each solution is compared with three references:

* min-L2 interpolant (pseudo-inverse): where gradient descent from 0 must land;
* min-L1 interpolant (a linear program, ``scipy.optimize.linprog``);
* ``argmin D_R(theta, theta0) s.t. X theta = y`` for the hyperbolic entropy
  ``R_alpha(theta) = sum[(1 + a|t|) log(1 + a|t|) - a|t|] / a^2`` (docs/design.md §2.4), which is
  ``argmin R_alpha`` when ``theta0 = 0``; computed from the smooth dual (below).

Methods: GD (``torch.optim.SGD``); HAM over GD (``horst.HORSTSGD`` with no momentum, no
weight decay and ``beta = 0``: the mirror step of HAM, Jacobs et al., ICLR 2026,
arXiv 2506.02630, composed with GD, ``u = lr * g``; HAM's clamp of the exponent at +-5 is
never reached here); Adam; AdamW; HORST (``horst.HORST``,
AdamW + mirror step, Jacobs, Jain, Burkholz, arXiv 2605.21104) for several alpha with
``beta > 0`` in the paper's order "ms", and the same sweep in the ablation order "sm".
``theta`` is a 1-D tensor, so the horst optimizers get the group key ``hyperbolic=True``
(their default applies the mirror step to ``ndim >= 2`` tensors only).

Theory of HAM over GD (what the R_alpha reference encodes)
----------------------------------------------------------
One step is ``theta' = (theta - lr g) * exp(-alpha * sign(theta - lr g) * lr g)``, that is
``theta' = theta - lr (1 + alpha |theta|) g + O(lr^2)``. Its flow ``dtheta/dt = -(1 + alpha
|theta|) grad L`` is the mirror flow ``d/dt grad R(theta) = -grad L`` of the potential with
``R''(t) = 1 / (1 + alpha |t|)``, i.e. ``grad R(t) = sign(t) log(1 + alpha |t|) / alpha`` and
``R = R_alpha`` above (no extra scaling between alpha and R). For least squares ``grad L``
lies in the row space of X, so ``grad R(theta(t)) - grad R(theta0)`` does too; at an
interpolating limit that is the KKT condition of ``argmin D_R(theta, theta0) s.t.
X theta = y``. The dual of that problem is smooth and unconstrained,

    min_mu  sum R*(X^T mu + c) - mu^T y,   c = grad R(theta0),
    R*(z) = (exp(alpha |z|) - 1 - alpha |z|) / alpha^2,
    theta = grad R*(z) = sign(z) (exp(alpha |z|) - 1) / alpha,   z = X^T mu + c,

and is solved by a trust-region Newton method with analytic gradient and Hessian
``X diag(exp(alpha |z|)) X^T`` (``scipy.optimize.minimize(method="trust-exact")``).
As alpha grows, argmin R_alpha moves from the min-L2 to the min-L1 interpolant.

The discrete iteration follows the flow up to an error of first order in ``lr * |g|``,
which builds up where the gradient is large, i.e. at the start. HAM over GD therefore uses
a linear learning-rate warm-up (``--ham-lr0`` to ``--ham-lr`` over ``--ham-warmup`` steps):
on the default problem ~2.3k steps end 6e-4 (relative) from the reference, where a constant
``lr = 3e-3`` needed ~12k steps to end 2e-3 from it.

Initialisation
--------------
A purely multiplicative update cannot leave 0, but the HORST/HAM compositions can: in order
"ms" the additive step comes first (``theta_half = 0 - u``), and in order "sm" Adam's step of
the mirror-scaled gradient is additive too. So every method starts from 0 by default. ``--init-scale c`` starts the
hyperbolic methods (HAM over GD, HORST, HORST-sm) from the uniform ``theta0 = c``; the flow
then minimises the Bregman divergence ``D_R(theta, theta0)`` rather than ``R_alpha``, and the
reference uses the same ``theta0`` (``c = grad R(theta0)`` above). Unlike the ``m * w``
overparameterisation, whose potential is set by its initialisation scale, HAM's potential is
set by alpha alone; theta0 only adds the linear term ``-<grad R(theta0), theta>``. That term
is not negligible: on the default problem ``theta0 = 1e-3`` moves the limit by 1.1e-2
(relative), twenty times the discretisation error, and HAM over GD lands on the theta0-aware
reference (6e-4).

HORST
-----
HORST over Adam has no such closed form (Adam's normalised direction does not vanish near a
solution). With ``beta > 0`` the shrinkage ``exp(-lr beta)`` regularises explicitly: at a rest
point of the flow ``dtheta/dt = -(1 + alpha |theta|) u - beta theta`` Adam's step is
``u = -beta theta / (1 + alpha |theta|) = -beta grad psi(theta)`` with ``psi(t) = |t| / alpha -
log(1 + alpha |t|) / alpha^2``, a penalty that is ``t^2 / 2`` at alpha = 0 and tends to
``|t| / alpha`` as alpha grows. So HORST with ``beta > 0`` ends near, not at, interpolation
(the table reports the residual) and its L1 norm falls as alpha grows; with ``beta = 0`` it
does not (docs/design.md §2.1).

Order "sm" is the paper's S∘M (docs/design.md §2.1): the mirror operator scales the
*gradient*, ``g_m = (1 + alpha |theta|) g``, Adam steps with ``g_m`` and beta's shrinkage
applies to theta. Adam's normalisation cancels a scale that varies slowly against its
averaging window, so the rest point is that of AdamW with decay ``beta`` (``psi(t) = t^2 / 2``
for every alpha): the L1 norm stays at its alpha = 0 value, which the sweep includes (HORST
with alpha = 0 is AdamW with decoupled decay beta). How well the scale cancels depends on the
step: at the default lr (alpha * lr up to 3) "sm" stays within a few per cent of AdamW while
"ms" falls to about a third; at lr 0.01 "sm" also drifts down, by about 20 % at alpha 300 (the
scale then moves within Adam's window).
Adam, AdamW and HORST use a cosine learning-rate decay to 0 over ``--steps`` steps.

Numerics: parameters are float64 and the optimizers compute in float64 (HORST's plain path
promotes to float64, with float64 scalars and ``torch.exp``). HORST runs with
``fused=False``: its fast path serves float32 and would compile a kernel for these
120-element steps.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import linprog, minimize

import horst

DEFAULT_OUT = Path("outputs") / "toy"  # the committed table is regenerated with --out results/toy
# Relative residual ||X theta - y|| / ||y|| at which GD and HAM over GD stop.
INTERPOLATION_TOL = 1e-10


# ----------------------------------------------------------------------------- problem


@dataclass(frozen=True)
class Problem:
    """``y = X theta_star`` with ``X`` n x d (n < d), entries N(0, 1/n), ``theta_star`` k-sparse."""

    X: np.ndarray
    y: np.ndarray
    theta_star: np.ndarray


def make_problem(*, n: int, d: int, k: int, seed: int) -> Problem:
    if not 0 < n < d:
        raise ValueError(f"need 0 < n < d for an underdetermined problem, got n={n}, d={d}")
    if not 0 < k <= d:
        raise ValueError(f"sparsity k must be in [1, d={d}], got {k}")
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) / math.sqrt(n)
    theta_star = np.zeros(d)
    theta_star[rng.choice(d, size=k, replace=False)] = rng.standard_normal(k)
    return Problem(X=X, y=X @ theta_star, theta_star=theta_star)


# ----------------------------------------------------------------------------- references


def min_l2_interpolant(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The minimum-norm solution of ``X theta = y`` (pseudo-inverse)."""
    return np.linalg.pinv(X) @ y


def min_l1_interpolant(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``argmin ||theta||_1 s.t. X theta = y`` as the LP over ``theta = p - q``, ``p, q >= 0``."""
    d = X.shape[1]
    result = linprog(np.ones(2 * d), A_eq=np.hstack([X, -X]), b_eq=y, bounds=(0, None), method="highs")
    if not result.success:
        raise RuntimeError(f"min-L1 linear program failed: {result.message}")
    return result.x[:d] - result.x[d:]


def hyperbolic_entropy(theta: np.ndarray, alpha: float) -> float:
    """``R_alpha(theta) = sum[(1 + a|t|) log(1 + a|t|) - a|t|] / a^2`` (``||theta||^2 / 2`` at a = 0)."""
    if alpha == 0:
        return 0.5 * float(theta @ theta)
    at = alpha * np.abs(theta)
    return float(np.sum((1 + at) * np.log1p(at) - at)) / alpha**2


def hyperbolic_mirror_map(theta: np.ndarray, alpha: float) -> np.ndarray:
    """``grad R_alpha(theta) = sign(theta) log(1 + alpha |theta|) / alpha`` (theta at alpha = 0)."""
    if alpha == 0:
        return np.asarray(theta, dtype=float)
    return np.sign(theta) * np.log1p(alpha * np.abs(theta)) / alpha


def hyperbolic_entropy_interpolant(
    X: np.ndarray, y: np.ndarray, alpha: float, theta0: float | np.ndarray = 0.0
) -> np.ndarray:
    """``argmin D_R(theta, theta0) s.t. X theta = y`` for ``R = R_alpha``, by the smooth dual.

    ``theta0 = 0`` gives ``argmin R_alpha``; alpha = 0 is the quadratic, i.e. the interpolant
    closest to theta0 in L2. Raises if the dual solution does not interpolate.
    """
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    n, d = X.shape
    theta0 = np.broadcast_to(np.asarray(theta0, dtype=float), (d,))
    if alpha == 0:
        return theta0 + np.linalg.pinv(X) @ (y - X @ theta0)
    shift = hyperbolic_mirror_map(theta0, alpha)

    def objective(mu: np.ndarray) -> tuple[float, np.ndarray]:
        z = X.T @ mu + shift
        value, slope, _ = _exp_minus_linear(alpha * np.abs(z))
        return float(value.sum()) / alpha**2 - mu @ y, X @ (np.sign(z) * slope / alpha) - y

    def hessian(mu: np.ndarray) -> np.ndarray:
        return (X * _exp_minus_linear(alpha * np.abs(X.T @ mu + shift))[2]) @ X.T

    result = minimize(
        objective,
        np.zeros(n),
        jac=True,
        hess=hessian,
        method="trust-exact",
        options={"gtol": 1e-12 * max(1.0, float(np.linalg.norm(y))), "maxiter": 2000},
    )
    # The trust region stops once the dual's value no longer resolves progress (its gradient
    # X theta - y can then still be ~1e-8); plain Newton steps, kept while they shrink the gradient,
    # take it to round-off.
    mu, gradient = result.x, objective(result.x)[1]
    for _ in range(10):
        candidate = mu - np.linalg.solve(hessian(mu), gradient)
        candidate_gradient = objective(candidate)[1]
        if not np.linalg.norm(candidate_gradient) < np.linalg.norm(gradient):
            break
        mu, gradient = candidate, candidate_gradient
    z = X.T @ mu + shift
    theta = np.sign(z) * np.expm1(alpha * np.abs(z)) / alpha
    infeasibility = np.linalg.norm(X @ theta - y) / np.linalg.norm(y)
    if not np.isfinite(infeasibility) or infeasibility > 1e-8:
        raise RuntimeError(
            f"R_alpha dual (alpha={alpha}) did not converge: ||X theta - y|| / ||y|| = "
            f"{infeasibility:.1e} ({result.message})"
        )
    return theta


# Beyond this argument the dual's exp(w) - 1 - w is continued by its second-order Taylor
# polynomial: the dual stays convex, smooth and finite at trust-region trial points that
# overshoot, and its minimiser is unchanged (there w = log(1 + alpha |theta|), far below 50).
DUAL_EXP_CAP = 50.0


def _exp_minus_linear(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``phi(w) = exp(w) - 1 - w`` for ``w >= 0`` with ``phi'`` and ``phi''`` (capped as above)."""
    capped = np.minimum(w, DUAL_EXP_CAP)
    excess = w - capped
    grow, curvature = np.expm1(capped), np.exp(capped)
    value = grow - capped + grow * excess + 0.5 * curvature * excess**2
    return value, grow + curvature * excess, curvature


# ----------------------------------------------------------------------------- methods


@dataclass(frozen=True)
class Method:
    """One optimizer run: how to build it, its lr at each step, and when to stop."""

    name: str
    family: str  # "GD", "HAM-GD", "Adam", "AdamW", "HORST", "HORST-sm"
    build: Callable[[list[dict[str, Any]]], torch.optim.Optimizer]
    lr_at: Callable[[int], float]
    max_steps: int
    init: float = 0.0
    hyperbolic: bool = False  # pass the horst group key ``hyperbolic=True``
    stop_at_interpolation: bool = False  # stop at INTERPOLATION_TOL (GD, HAM over GD)
    alpha: float | None = None
    settings: str = ""


def cosine(lr: float, steps: int) -> Callable[[int], float]:
    return lambda step: lr * 0.5 * (1 + math.cos(math.pi * step / steps))


def linear_warmup(lr0: float, lr: float, warmup: int) -> Callable[[int], float]:
    return lambda step: lr if step >= warmup else lr0 + (lr - lr0) * step / warmup


def build_methods(args: argparse.Namespace, problem: Problem) -> list[Method]:
    gd_lr = args.gd_lr if args.gd_lr is not None else 1.0 / np.linalg.norm(problem.X, 2) ** 2
    cos = cosine(args.lr, args.steps)
    methods = [
        Method(
            "GD",
            "GD",
            lambda p: torch.optim.SGD(p, lr=gd_lr),
            lambda _: gd_lr,
            args.max_steps,
            stop_at_interpolation=True,
            settings=f"lr {gd_lr:.3g}",
        ),
        Method(
            f"HAM over GD (alpha={args.ham_alpha:g})",
            "HAM-GD",
            lambda p: horst.HORSTSGD(p, lr=args.ham_lr, alpha=args.ham_alpha, beta=0.0),
            linear_warmup(args.ham_lr0, args.ham_lr, args.ham_warmup),
            args.max_steps,
            init=args.init_scale,
            hyperbolic=True,
            stop_at_interpolation=True,
            alpha=args.ham_alpha,
            settings=f"lr {args.ham_lr0:g}->{args.ham_lr:g} over {args.ham_warmup}, beta 0",
        ),
        Method(
            "Adam",
            "Adam",
            lambda p: torch.optim.Adam(p, lr=args.lr),
            cos,
            args.steps,
            settings=f"lr {args.lr:g} cos",
        ),
        Method(
            f"AdamW (wd={args.adamw_weight_decay:g})",
            "AdamW",
            lambda p: torch.optim.AdamW(p, lr=args.lr, weight_decay=args.adamw_weight_decay),
            cos,
            args.steps,
            settings=f"lr {args.lr:g} cos",
        ),
    ]
    for order, family in (("ms", "HORST"), ("sm", "HORST-sm")):
        for alpha in args.alphas:
            methods.append(
                Method(
                    f"{family} (alpha={alpha:g}, beta={args.beta:g})",
                    family,
                    lambda p, alpha=alpha, order=order: horst.HORST(
                        p,
                        lr=args.lr,
                        alpha=alpha,
                        beta=args.beta,
                        order=order,
                        weight_decay=args.horst_weight_decay,
                        fused=False,
                    ),
                    cos,
                    args.steps,
                    init=args.init_scale,
                    hyperbolic=True,
                    alpha=alpha,
                    settings=f"lr {args.lr:g} cos, wd {args.horst_weight_decay:g}",
                )
            )
    return methods


@dataclass(frozen=True)
class Run:
    theta: np.ndarray
    residual: float  # ||X theta - y||
    steps: int


def train(problem: Problem, method: Method) -> Run:
    """Full-batch training of ``0.5 ||X theta - y||^2`` in float64, gradient in closed form."""
    X = torch.from_numpy(problem.X)
    y = torch.from_numpy(problem.y)
    y_norm = float(y.norm())
    theta = torch.nn.Parameter(torch.full((X.shape[1],), method.init, dtype=torch.float64))
    group: dict[str, Any] = {"params": [theta]}
    if method.hyperbolic:
        group["hyperbolic"] = True
    optimizer = method.build([group])
    with torch.no_grad():
        for step in range(method.max_steps):
            residual = X @ theta - y
            residual_norm = float(residual.norm())
            if not math.isfinite(residual_norm):
                raise FloatingPointError(
                    f"{method.name} diverged at step {step}: lower its learning rate or alpha (see --help)"
                )
            if method.stop_at_interpolation and residual_norm <= INTERPOLATION_TOL * y_norm:
                break
            theta.grad = X.T @ residual
            for param_group in optimizer.param_groups:
                param_group["lr"] = method.lr_at(step)
            optimizer.step()
        else:
            step = method.max_steps
        solution = theta.detach().numpy().copy()
    residual_norm = float(np.linalg.norm(problem.X @ solution - problem.y))
    if not math.isfinite(residual_norm):
        raise FloatingPointError(f"{method.name} diverged: lower its learning rate or alpha (see --help)")
    return Run(solution, residual_norm, step)


# ----------------------------------------------------------------------------- report


def relative_distance(theta: np.ndarray, reference: np.ndarray) -> float:
    return float(np.linalg.norm(theta - reference) / np.linalg.norm(reference))


def summarize(theta: np.ndarray, references: dict[str, np.ndarray], *, nnz_threshold: float) -> dict[str, float]:
    row = {
        "L1": float(np.abs(theta).sum()),
        "L2": float(np.linalg.norm(theta)),
        "Linf": float(np.abs(theta).max()),
        "nnz": int((np.abs(theta) > nnz_threshold).sum()),
    }
    for name, reference in references.items():
        row[f"to {name}"] = relative_distance(theta, reference)
    return row


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.2e}"
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def plot(
    path: Path,
    problem: Problem,
    references: dict[str, np.ndarray],
    runs: dict[str, Run],
    methods: list[Method],
    *,
    ham_alpha: float,
    alpha_curve: dict[float, float],
) -> None:
    """Left: sorted coefficient magnitudes; right: L1 norm against alpha for HORST / HORST-sm.

    ``alpha_curve`` maps alpha to the L1 norm of the R_alpha reference (HAM over GD's limit)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    by_family: dict[str, list[Method]] = {}
    for method in methods:
        by_family.setdefault(method.family, []).append(method)
    floor = 1e-8
    reference_styles = {"min-L2": ":", "min-L1": "--", "R_alpha": "-."}
    for name, theta in references.items():
        label = name if name != "R_alpha" else f"argmin R_alpha, alpha={ham_alpha:g}"
        magnitudes = np.maximum(np.sort(np.abs(theta))[::-1], floor)
        left.semilogy(
            np.arange(1, len(theta) + 1),
            magnitudes,
            reference_styles[name],
            color="k",
            label=f"{label} (reference)",
            linewidth=2.0,
        )
    for family in ("GD", "HAM-GD", "Adam", "AdamW", "HORST", "HORST-sm"):
        method = max(by_family[family], key=lambda m: m.alpha or 0.0)  # a sweep's largest alpha
        magnitudes = np.maximum(np.sort(np.abs(runs[method.name].theta))[::-1], floor)
        left.semilogy(np.arange(1, len(magnitudes) + 1), magnitudes, label=method.name, linewidth=1.2)
    left.set(xlabel="rank", ylabel=f"|theta_i| (sorted, floored at {floor:g})", title="coefficient profiles")
    left.legend(fontsize=7)

    for family, marker in (("HORST", "o-"), ("HORST-sm", "s-")):
        sweep = sorted(by_family[family], key=lambda m: m.alpha)
        l1_norms = [np.abs(runs[m.name].theta).sum() for m in sweep]
        right.plot([m.alpha for m in sweep], l1_norms, marker, label=family)
    alphas = sorted(alpha_curve)
    right.plot(alphas, [alpha_curve[a] for a in alphas], "^:", label="argmin R_alpha (HAM over GD's limit)")
    for name, color in (("min-L2", "tab:gray"), ("min-L1", "k")):
        right.axhline(np.abs(references[name]).sum(), color=color, linestyle="--", label=name)
    right.axhline(np.abs(runs["Adam"].theta).sum(), color="tab:red", linestyle=":", label="Adam")
    if 0 in alphas:  # alpha = 0 is allowed (HORST = AdamW with decay beta)
        right.set_xscale("symlog", linthresh=1.0)
    else:
        right.set_xscale("log")
    right.set(xlabel="alpha", ylabel="||theta||_1", title="L1 norm of the solution against alpha")
    right.legend(fontsize=7)
    fig.suptitle(
        f"underdetermined least squares, n={problem.X.shape[0]}, d={problem.X.shape[1]}, "
        f"k={int((problem.theta_star != 0).sum())}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    problem = parser.add_argument_group("problem")
    problem.add_argument("--seed", type=int, default=0)
    problem.add_argument("--n", type=int, default=40, help="samples (rows of X)")
    problem.add_argument("--d", type=int, default=120, help="features (columns of X), > n")
    problem.add_argument("--k", type=int, default=5, help="non-zeros of the ground truth")
    runs = parser.add_argument_group("optimizers")
    runs.add_argument("--steps", type=int, default=6000, help="steps of Adam, AdamW, HORST (cosine lr decay)")
    runs.add_argument("--lr", type=float, default=0.003, help="peak lr of Adam, AdamW, HORST")
    runs.add_argument("--gd-lr", type=float, default=None, help="GD lr; default 1 / ||X||_2^2")
    runs.add_argument("--max-steps", type=int, default=20000, help="step cap of GD and HAM over GD")
    runs.add_argument("--ham-alpha", type=float, default=10.0, help="alpha of HAM over GD")
    runs.add_argument("--ham-lr", type=float, default=0.02, help="HAM over GD lr after warm-up")
    runs.add_argument("--ham-lr0", type=float, default=5e-4, help="HAM over GD lr at step 0")
    runs.add_argument("--ham-warmup", type=int, default=1000, help="HAM over GD linear warm-up steps")
    runs.add_argument(
        "--alphas",
        type=float,
        nargs="+",
        default=[0.0, 10.0, 100.0, 300.0, 1000.0],
        help="alphas of the HORST and HORST-sm sweeps",
    )
    runs.add_argument("--beta", type=float, default=1.0, help="beta of HORST and HORST-sm")
    runs.add_argument("--horst-weight-decay", type=float, default=0.0, help="AdamW decay inside HORST")
    runs.add_argument("--adamw-weight-decay", type=float, default=0.1)
    runs.add_argument(
        "--init-scale",
        type=float,
        default=0.0,
        help="uniform theta0 of HAM over GD, HORST, HORST-sm (others start at 0)",
    )
    report = parser.add_argument_group("report")
    report.add_argument("--nnz-threshold", type=float, default=1e-3, help="|theta_i| above it is non-zero")
    report.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for table.md, implicit_bias.png")
    report.add_argument("--no-plot", action="store_true", help="skip the plot")
    args = parser.parse_args(argv)
    for name in ("steps", "max_steps", "ham_warmup"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("lr", "ham_lr", "ham_lr0", "gd_lr"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {value}")
    if args.ham_alpha < 0 or any(a < 0 for a in args.alphas):
        parser.error("--ham-alpha and --alphas must be >= 0")
    if not 0 < args.n < args.d:
        parser.error(f"need 0 < --n < --d (underdetermined), got n={args.n}, d={args.d}")
    if not 0 < args.k <= args.d:
        parser.error(f"--k must be in [1, d={args.d}], got {args.k}")
    return args


def references_for(problem: Problem, *, alpha: float, theta0: float) -> dict[str, np.ndarray]:
    return {
        "min-L2": min_l2_interpolant(problem.X, problem.y),
        "min-L1": min_l1_interpolant(problem.X, problem.y),
        "R_alpha": hyperbolic_entropy_interpolant(problem.X, problem.y, alpha, theta0),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from tqdm import tqdm

    args = parse_args(argv)
    given = sys.argv[1:] if argv is None else list(argv)
    command = shlex.join(["python", "scripts/toy_implicit_bias.py", *given])
    problem = make_problem(n=args.n, d=args.d, k=args.k, seed=args.seed)
    references = references_for(problem, alpha=args.ham_alpha, theta0=args.init_scale)
    methods = build_methods(args, problem)

    runs: dict[str, Run] = {}
    progress = tqdm(methods, desc="methods", unit="run", file=sys.stderr)
    for method in progress:
        progress.set_postfix_str(method.name)
        try:
            runs[method.name] = train(problem, method)
        except FloatingPointError as error:  # a step size too large: say so, no traceback
            raise SystemExit(f"toy_implicit_bias.py: error: {error}") from None

    header = [
        "method",
        "theta0",
        "settings",
        "steps",
        "L1",
        "L2",
        "Linf",
        "to min-L2",
        "to min-L1",
        f"to R_alpha={args.ham_alpha:g}",
        "nnz",
        "residual",
    ]
    rows = []
    for name, theta in {"ground truth": problem.theta_star, **references}.items():
        s = summarize(theta, references, nnz_threshold=args.nnz_threshold)
        if name == "R_alpha":
            name = f"argmin R_alpha (alpha={args.ham_alpha:g}, theta0={args.init_scale:g})"
        residual = float(np.linalg.norm(problem.X @ theta - problem.y))
        rows.append(
            [
                f"*{name}*",
                "",
                "reference",
                "",
                s["L1"],
                s["L2"],
                s["Linf"],
                s["to min-L2"],
                s["to min-L1"],
                s["to R_alpha"],
                s["nnz"],
                residual,
            ]
        )
    for method in methods:
        run = runs[method.name]
        s = summarize(run.theta, references, nnz_threshold=args.nnz_threshold)
        rows.append(
            [
                method.name,
                f"{method.init:g}",
                method.settings,
                run.steps,
                s["L1"],
                s["L2"],
                s["Linf"],
                s["to min-L2"],
                s["to min-L1"],
                s["to R_alpha"],
                s["nnz"],
                run.residual,
            ]
        )
    table = markdown_table(header, rows)

    alpha_curve = {
        alpha: np.abs(hyperbolic_entropy_interpolant(problem.X, problem.y, alpha, args.init_scale)).sum()
        for alpha in sorted(set(args.alphas))
    }
    notes = "\n".join(
        f"- {line}"
        for line in (
            f"Problem: n={args.n}, d={args.d}, k={args.k}, seed={args.seed}, X entries N(0, 1/n), "
            f"y = X theta_star (||y|| = {np.linalg.norm(problem.y):.3g}); loss 0.5 ||X theta - y||^2, "
            "full batch, float64.",
            "Distances are ||theta - ref||_2 / ||ref||_2; nnz counts |theta_i| > "
            f"{args.nnz_threshold:g}; residual is ||X theta - y||_2.",
            "theta0: GD, Adam, AdamW start at 0; HAM over GD, HORST, HORST-sm at the uniform "
            f"theta0 = {args.init_scale:g} (--init-scale), and the R_alpha reference is "
            "argmin D_R(theta, theta0) s.t. X theta = y for that theta0.",
            f"GD and HAM over GD stop at ||X theta - y|| <= {INTERPOLATION_TOL:g} ||y|| (or --max-steps); "
            f"Adam, AdamW, HORST run {args.steps} steps with a cosine decay from lr {args.lr:g}.",
            "AdamW (wd > 0) and HORST (beta > 0) shrink the weights explicitly every step, so they end "
            "near, not at, interpolation (see their residuals).",
            "L1 norm of argmin R_alpha at the sweep's alphas: "
            + ", ".join(f"alpha={a:g}: {v:.3g}" for a, v in alpha_curve.items())
            + ".",
        )
    )
    print(table)
    print()
    print(notes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(
        f"# Toy implicit-bias experiment (docs/design.md §2.4)\n\nProduced by:\n\n    {command}\n\n{table}\n\n{notes}\n"
    )
    if not args.no_plot:
        plot(
            args.out / "implicit_bias.png",
            problem,
            references,
            runs,
            methods,
            ham_alpha=args.ham_alpha,
            alpha_curve=alpha_curve,
        )
    print(f"\nwrote {args.out / 'table.md'}" + ("" if args.no_plot else " and implicit_bias.png"))
    return {"problem": problem, "references": references, "runs": runs, "methods": methods, "table": table}


if __name__ == "__main__":
    main()
