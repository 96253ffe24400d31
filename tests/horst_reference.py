"""Plain references for the optimizers of ``horst`` (docs/design.md §2), written from the
formulas and shared by the optimizer tests (float32 unless the caller passes float64)."""

from __future__ import annotations

import math

import torch


def adam_update(m, v, g, *, step, lr, betas, eps):
    """Returns (u, m, v): u = Adam(g, lr) exactly as docs/design.md §2 writes it."""
    b1, b2 = betas
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    u = (lr / (1 - b1**step)) * m / (torch.sqrt(v) / math.sqrt(1 - b2**step) + eps)
    return u, m, v


def reference_horst_step(theta, m, v, g, *, step, lr, betas, eps, wd, alpha, beta, order, hyperbolic):
    if not hyperbolic:
        alpha, beta = 0.0, 0.0
    if order == "ms":
        u, m, v = adam_update(m, v, g, step=step, lr=lr, betas=betas, eps=eps)
        half = theta * (1 - lr * wd) - u
        theta = half * torch.exp(-alpha * torch.sign(half) * u - lr * beta)
    else:  # S∘M: Adam of the mirror-scaled gradient (docs/design.md §2.1)
        g_m = (1 + alpha * theta.abs()) * g
        u, m, v = adam_update(m, v, g_m, step=step, lr=lr, betas=betas, eps=eps)
        theta = theta * (1 - lr * wd) * math.exp(-lr * beta) - u
    return theta, m, v


def reference_ham_step(theta, m, v, g, *, step, lr, betas, eps, wd, alpha, beta, hyperbolic):
    u, m, v = adam_update(m, v, g, step=step, lr=lr, betas=betas, eps=eps)
    half = theta * (1 - lr * wd) - u
    if hyperbolic:
        half = half * torch.exp(torch.clamp(lr * (-alpha * torch.sign(half) * g - beta), -5, 5))
    return half, m, v


def make_params(seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(6, 5), (5,), (3, 2, 4)]
    return [torch.nn.Parameter(torch.randn(s, generator=generator, dtype=torch.float64).to(dtype)) for s in shapes]


def gradients(params, step):
    generator = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p.dtype) for p in params]


def run(optimizer_factory, steps, *, lrs=None, dtype=torch.float32):
    params = make_params(dtype=dtype)
    optimizer = optimizer_factory(params)
    for step in range(1, steps + 1):
        if lrs is not None:
            for group in optimizer.param_groups:
                group["lr"] = lrs[step - 1]
        for p, g in zip(params, gradients(params, step)):
            p.grad = g
        optimizer.step()
    return [p.detach().clone() for p in params], optimizer


def run_reference(reference_step, steps, *, lrs, **hyper):
    """The reference in float32, the precision of the optimizers under test."""
    thetas = [p.detach() for p in make_params()]
    ms = [torch.zeros_like(t) for t in thetas]
    vs = [torch.zeros_like(t) for t in thetas]
    for step in range(1, steps + 1):
        for i, (theta, g) in enumerate(zip(thetas, gradients(thetas, step))):
            thetas[i], ms[i], vs[i] = reference_step(
                theta, ms[i], vs[i], g, step=step, lr=lrs[step - 1], hyperbolic=theta.ndim >= 2, **hyper
            )
    return thetas


HYPER = dict(betas=(0.9, 0.99), eps=1e-8, wd=0.1)
LRS = [1e-2 * (0.5 + 0.5 * math.cos(math.pi * k / 20)) + 1e-3 for k in range(20)]  # a schedule


def max_abs_diff(a, b):
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def assert_close(actual, expected, tol=1e-6):
    """Within ``tol`` absolutely, or relatively for weights larger than 1 (float32 rounding
    of a weight of size 4 is already 2.4e-7 per step)."""
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.double(), e.double(), atol=tol, rtol=tol)


class HamOptimizerWrapper:
    """HAM's public reference wrapper, transcribed from the README of TomJacobs05/HAM (commit
    5128597): its ``step`` line for line, without the prints. The base optimizer steps first;
    then, for every parameter with a gradient and no NaN in it or in its weights, tensors with
    ``ndim >= 2`` are multiplied by ``exp(clamp(lr * (-alpha * sign(w) * g - beta), -5, 5))``
    where ``w != 0`` (reverted if that makes a NaN), and every such parameter's norm is capped
    at ``max_weight_norm``; ``clip_grad_norm_`` runs after the step."""

    def __init__(self, optimizer, alpha=200, beta=1e-3, max_weight_norm=1000.0, max_grad_norm=20.0):
        self.optimizer = optimizer
        self.max_weight_norm = max_weight_norm
        self.max_grad_norm = max_grad_norm
        self.alpha = alpha
        self.beta = beta
        self.param_groups = optimizer.param_groups

    def step(self, closure=None):
        self.optimizer.step(closure)
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if torch.isnan(param.data).any():
                    continue
                if torch.isnan(param.grad).any():
                    continue
                is_weight = len(param.shape) >= 2
                if is_weight:
                    orig_data = param.data.clone()
                    lr = group["lr"]
                    sign_term = torch.sign(param.data)
                    base_exponent = -self.alpha * sign_term * param.grad - self.beta
                    exponent = torch.clamp(base_exponent * lr, -5.0, 5.0)
                    if torch.isnan(exponent).any():
                        continue
                    update_factor = torch.exp(exponent)
                    mask = param.data != 0
                    param.data[mask] = param.data[mask] * update_factor[mask]
                    if torch.isnan(param.data).any():
                        param.data = orig_data
                        continue
                weight_norm = torch.norm(param.data)
                if weight_norm > self.max_weight_norm:
                    param.data = param.data * (self.max_weight_norm / weight_norm)
            torch.nn.utils.clip_grad_norm_(group["params"], max_norm=self.max_grad_norm)
