"""AdamW composed with a hyperbolic mirror step: the base class of ``HORST`` and ``HAM``.

The two optimizers share AdamW's state (``step``, ``exp_avg``, ``exp_avg_sq``) and its
update; they differ only in the coefficients of the mirror step (``horst.mirror``), which a
subclass supplies per param group. Which tensors take the mirror step is the group key
``hyperbolic``: ``True``/``False`` for the whole group, or ``None`` (default) for HAM's rule,
every tensor with ``ndim >= 2``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer

from horst._fast_path import adamw_mirror_foreach_, use_fast_path
from horst._validation import check_betas, check_non_negative, check_order
from horst.functional import MirrorCoefficients, adamw_mirror_values


class AdamWMirror(Optimizer):
    """AdamW followed (or, with ``order="sm"``, preceded) by a mirror step.

    Subclasses implement ``mirror_coefficients(group)``.
    """

    def __init__(
        self,
        params: Iterable[Any],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        alpha: float,
        beta: float,
        order: str,
        fused: bool | None,
    ) -> None:
        check_non_negative(lr=lr, eps=eps, weight_decay=weight_decay, alpha=alpha, beta=beta)
        check_betas(betas)
        check_order(order)
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
            alpha=alpha, beta=beta, order=order, hyperbolic=None,
        )  # fmt: skip
        super().__init__(params, defaults)
        for group in self.param_groups:
            self._check_group(group)
        self.fast = use_fast_path(fused)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "fast"):  # groups added after construction are checked too
            self._check_group(self.param_groups[-1])

    @staticmethod
    def _check_group(group: dict[str, Any]) -> None:
        check_non_negative(
            lr=group["lr"], eps=group["eps"], weight_decay=group["weight_decay"],
            alpha=group["alpha"], beta=group["beta"],
        )  # fmt: skip
        check_betas(group["betas"])
        check_order(group["order"])
        if group["hyperbolic"] not in (None, True, False):
            raise ValueError(f"hyperbolic must be True, False or None, got {group['hyperbolic']!r}")

    def mirror_coefficients(self, group: dict[str, Any]) -> MirrorCoefficients:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            # tensors that share the step's scalars (same step count, mirror step or not) are
            # updated together: the CPU fast path takes each such batch in one call
            batches: dict[tuple[int, bool], list[tuple[torch.Tensor, ...]]] = defaultdict(list)
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                state = self.state[param]
                if not state:  # lazy initialisation, exactly torch.optim.AdamW's state
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["step"] += 1
                hyperbolic = param.ndim >= 2 if group["hyperbolic"] is None else group["hyperbolic"]
                batches[(int(state["step"].item()), hyperbolic)].append(
                    (param, param.grad, state["exp_avg"], state["exp_avg_sq"])
                )

            beta1, beta2 = group["betas"]
            mirror = self.mirror_coefficients(group)
            for (step, hyperbolic), tensors in batches.items():
                values = adamw_mirror_values(
                    lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                    weight_decay=group["weight_decay"], step=step,
                    mirror=mirror if hyperbolic else MirrorCoefficients.none(),
                )  # fmt: skip
                adamw_mirror_foreach_(tensors, values, mirror_first=group["order"] == "sm", fast=self.fast)
        return loss
