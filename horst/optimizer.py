"""``MirrorOptimizer``: the base class of every optimizer in ``horst`` (docs/design.md §2).

It owns what the optimizers share: argument checks (done once, in ``_check_group``, for the
constructor, for groups added later and again at every ``step`` so that an invalid group
changes no tensor), torch's conventions (positional ``lr``, tensor ``lr``, ``maximize``,
``foreach``/``fused``/``capturable``/``differentiable``, complex parameters through
``torch.view_as_real``, sparse gradients refused before anything changes), the rule that picks
the tensors taking the mirror step, lazily initialised state, ``__setstate__`` (state dicts of
the plain optimizers and of older versions load), and the step loop, which hands each batch of
tensors sharing the step's scalars to the plain or the fast path (``horst._fast_path``).

A base optimizer (``horst.adamw``, ``horst.lion``, ``horst.sgd``) is one subclass that says
what its state is (``_state_names``, ``_prepare``), what its step's scalars
are (``_scalars``) and how it descends (``_descend``: a function of ``horst.functional`` form
and the matching base of the C kernel). The group key ``hyperbolic`` chooses the tensors that
take the mirror step: ``True``/``False`` for the whole group, ``None`` (default) for HAM's rule,
every tensor with ``ndim >= 2``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from horst._fast_path import mirror_step_foreach_, use_fast_path
from horst.functional import Descend, Scalars

ORDERS = ("ms", "sm")
# what the flags of torch's optimizers mean here
CONVENTION_DEFAULTS = dict(maximize=False, foreach=None, fused=None, capturable=False, differentiable=False)
# the flags that choose how a step is computed, not what it computes: a state dict's (an
# AdamW(foreach=True) checkpoint's) do not replace this optimizer's own
IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable", "differentiable")


class MirrorOptimizer(Optimizer):
    """A steepest-descent step composed with the hyperbolic mirror step (see the module docstring).

    Subclasses call ``super().__init__(params, defaults, **conventions)`` with their own
    ``defaults`` (which must hold ``lr``, ``weight_decay``, ``alpha``, ``beta``) and implement
    the ``_`` hooks below.
    """

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], **conventions: Any) -> None:
        unknown = set(conventions) - set(CONVENTION_DEFAULTS)
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected keyword arguments {sorted(unknown)}")
        defaults = {**defaults, **CONVENTION_DEFAULTS, **conventions, "hyperbolic": None}
        self._check_group(defaults)
        self._flat_buffers: dict = {}  # the fast path's flat copies of small tensors (horst._fast_path)
        super().__init__(params, defaults)

    # ------------------------------------------------------------------ hooks of a base optimizer

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        """The tensor state of one parameter, in the order ``_descend``'s function takes it."""
        raise NotImplementedError

    def _prepare(self, param: Tensor, state: dict[str, Any], group: dict[str, Any]) -> Any:
        """Fills in missing state (lazily, at a parameter's first step) and counts the step;
        returns what, besides the group, sets the step's scalars (AdamW: the step number; SGD:
        whether the momentum buffer is new). Parameters with equal keys are updated together."""
        raise NotImplementedError

    def _scalars(
        self, group: dict[str, Any], lr: float | Tensor, key: Any, mirror: tuple[float | Tensor, ...]
    ) -> Scalars:
        """The step's scalars; ``mirror`` is ``(alpha_u, alpha_g, lr_beta, clip)``. ``lr`` is the
        group's as given: scalars derived from a tensor lr are computed in tensor arithmetic, as
        torch's optimizers compute them (``horst.functional.scalars`` takes their values)."""
        raise NotImplementedError

    def _descend(self, group: dict[str, Any]) -> tuple[Descend, int]:
        """The base's ``descend`` function (``horst.functional``) and its base in the C kernel."""
        raise NotImplementedError

    def _mirror(self, group: dict[str, Any], lr: float | Tensor) -> tuple[float | Tensor, ...]:
        """``(alpha_u, alpha_g, lr_beta, clip)`` of a hyperbolic tensor (``horst.mirror``): HORST's
        pull by the update, no clamp."""
        return (group["alpha"], 0.0, lr * group["beta"], math.inf)

    def _guard(self, group: dict[str, Any]) -> bool:
        """Whether hyperbolic tensors keep their old value where the step is not finite (HAM)."""
        return False

    def _norm_cap(self, group: dict[str, Any]) -> float | None:
        """The cap on each new parameter's L2 norm (HAM's), or None: the fast path applies it in
        the step's own pass where it can (the C kernel sums the squares as it steps, a flat
        compiled call scales its flat copy), ``_after_step`` to the others."""
        return None

    def _after_step(self, group: dict[str, Any], params: list[Tensor]) -> None:
        """Runs after a group's step on the parameters it stepped that the step did not cap
        (HAM's norm cap on the others)."""

    def _check_base(self, group: dict[str, Any]) -> None:
        """The base's own hyperparameters (betas, momentum, ...): ``ValueError`` naming the argument."""

    # ------------------------------------------------------------------ checks

    def _check_group(self, group: dict[str, Any]) -> None:
        lr = group["lr"]
        if isinstance(lr, Tensor):
            if lr.numel() != 1:
                raise ValueError(f"lr as a tensor must hold one value, got shape {tuple(lr.shape)}")
            lr = float(lr)
        check_non_negative(lr=lr, weight_decay=group["weight_decay"], alpha=group["alpha"], beta=group["beta"])
        if "order" in group and group["order"] not in ORDERS:
            raise ValueError(
                f"order must be 'ms' (mirror after steepest descent, the paper's HORST) or "
                f"'sm' (S∘M, the paper's ablation), got {group['order']!r}"
            )
        if group.get("hyperbolic") not in (None, True, False):
            raise ValueError(f"hyperbolic must be True, False or None, got {group['hyperbolic']!r}")
        if group.get("foreach"):
            raise ValueError(
                f"{type(self).__name__} has no foreach implementation: use fused=True (the fast path, one "
                "pass per tensor; the default) or fused=False (the plain path), and foreach=None"
            )
        if group.get("fused") not in (None, True, False):
            raise ValueError(f"fused must be True, False or None, got {group['fused']!r}")
        if group.get("capturable"):
            raise ValueError(
                f"{type(self).__name__} does not support capturable=True (CUDA graph capture): its step reads "
                "lr and the step count on the host; use capturable=False, or torch.optim.AdamW(capturable=True)"
            )
        if group.get("differentiable"):
            raise ValueError(
                f"{type(self).__name__} does not support differentiable=True: its step runs under no_grad and "
                "updates in place; use differentiable=False, or torch.optim.AdamW(differentiable=True)"
            )
        if group.get("amsgrad"):  # a key AdamW state dicts carry
            raise ValueError(f"{type(self).__name__} does not support amsgrad=True")
        if not isinstance(group.get("maximize", False), bool):
            raise ValueError(f"maximize must be a bool, got {group['maximize']!r}")
        self._check_base(group)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if hasattr(self, "defaults"):  # groups are checked before they are added
            self._check_group({**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}})
        super().add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``torch.optim.Optimizer.load_state_dict`` with two differences: every state tensor is
        checked against its parameter before anything changes (``ValueError`` naming the group,
        the index and both shapes), and the groups keep this optimizer's ``IMPLEMENTATION_FLAGS``
        (the saved groups' other keys, ``lr``, ``maximize``, ... are loaded as torch loads them)."""
        self._check_state_dict(state_dict)
        own_flags = [{flag: group[flag] for flag in IMPLEMENTATION_FLAGS} for group in self.param_groups]
        super().load_state_dict(state_dict)
        for group, flags in zip(self.param_groups, own_flags):
            group.update(flags)

    def _check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Each saved state tensor has its parameter's shape (``step``: one value) and a dtype the
        parameter can take (floating point for a real parameter, the parameter's own for a complex
        one). Parameters are matched as torch matches them, by position in their group; groups
        whose number or sizes differ are left to torch, which refuses them before any change."""
        saved_groups = state_dict.get("param_groups", [])
        if len(saved_groups) != len(self.param_groups) or any(
            len(saved["params"]) != len(group["params"]) for saved, group in zip(saved_groups, self.param_groups)
        ):
            return
        name = type(self).__name__
        for index, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            for position, (key, param) in enumerate(zip(saved["params"], group["params"])):
                where = f"param_groups[{index}]['params'][{position}]"
                for state_name, value in state_dict["state"].get(key, {}).items():
                    if not isinstance(value, Tensor):
                        continue
                    if state_name == "step":
                        if value.numel() != 1:
                            raise ValueError(
                                f"{name}.load_state_dict: 'step' of {where} has shape {tuple(value.shape)}, "
                                "not one value; nothing was loaded"
                            )
                        continue
                    if value.shape != param.shape:
                        raise ValueError(
                            f"{name}.load_state_dict: state {state_name!r} of {where} has shape {tuple(value.shape)}, "
                            f"its parameter {tuple(param.shape)} (saved with the parameters in another order?); "
                            "nothing was loaded"
                        )
                    if (value.dtype != param.dtype) if param.is_complex() else not value.is_floating_point():
                        raise ValueError(
                            f"{name}.load_state_dict: state {state_name!r} of {where} is {value.dtype}, its parameter "
                            f"{param.dtype} of shape {tuple(param.shape)}; nothing was loaded"
                        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Fills in group keys a state dict lacks (an AdamW checkpoint has no ``alpha``, older ones
        no ``maximize``) from the defaults, as torch's optimizers do, and keeps ``step`` where
        torch's non-fused AdamW keeps it, on the CPU: a number becomes a float32 tensor, and a
        tensor on an accelerator (a fused AdamW checkpoint, or one torch's ``load_state_dict``
        moved to its parameter because the saved group says ``fused=True``) is copied to the
        CPU here, once, rather than read across at every step."""
        super().__setstate__(state)
        self.__dict__.setdefault("_flat_buffers", {})  # not pickled: an unpickled optimizer makes its own
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)
        for param_state in self.state.values():
            step = param_state.get("step")
            if step is None:
                continue
            if not torch.is_tensor(step):
                param_state["step"] = torch.tensor(float(step), dtype=torch.float32)
            elif step.device.type != "cpu":
                param_state["step"] = step.cpu()

    # ------------------------------------------------------------------ the step

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = []
        for group in self.param_groups:  # every check before any tensor changes
            self._check_group(group)
            params = [p for p in group["params"] if p.grad is not None]
            for param in params:
                if param.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                if param.grad.is_complex() != param.is_complex():
                    raise RuntimeError(
                        f"{type(self).__name__}: a {param.grad.dtype} gradient for a {param.dtype} parameter"
                    )
                if param.grad.shape != param.shape:
                    raise RuntimeError(
                        f"{type(self).__name__}: gradient of shape {tuple(param.grad.shape)} for a parameter "
                        f"of shape {tuple(param.shape)}"
                    )
            work.append((group, params))
        for group, params in work:
            if params:
                self._step_group(group, params)
        return loss

    def _step_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        lr = group["lr"]  # a tensor lr stays one: the scalars follow torch's tensor-lr arithmetic
        descend, kernel_base = self._descend(group)
        names = self._state_names(group)
        hyperbolic = group["hyperbolic"]
        state_of = self.state
        prepare = self._prepare
        # per key (see _prepare): the parameters, their tensors, and whether each is whole and mirrored
        batches: dict[Any, tuple[list[Tensor], list[tuple[Tensor, ...]], list[bool], list[bool]]] = {}
        empty = []  # no element (on this rank, for a shard): no step, but the norm cap's collective
        for param in params:
            state = state_of[param]
            key = prepare(param, state, group)
            tensors = (param, param.grad, *[state[name] for name in names])
            if type(param) is not torch.nn.Parameter and type(param) is not Tensor:
                tensors = local_shards(tensors)
            if tensors[0].numel() == 0:  # a rank holding no element of a sharded parameter
                empty.append(param)
                continue
            whole = tensors[0] is param  # not a shard: the step's norm is the tensor's
            if param.is_complex():  # real and imaginary parts as independent reals, as torch's Adam
                tensors = tuple(torch.view_as_real(t) for t in tensors)
            batch = batches.get(key)
            if batch is None:
                batch = batches[key] = ([], [], [], [])
            batch[0].append(param)
            batch[1].append(tensors)
            batch[2].append(whole)
            batch[3].append(param.ndim >= 2 if hyperbolic is None else hyperbolic)
        norm_cap = self._norm_cap(group)
        guard = self._guard(group)
        order = group.get("order", "ms")
        fast = use_fast_path(group["fused"])
        rest = empty
        mirror = self._mirror(group, lr)
        for key, (batch_params, tensors, whole, mirrored) in batches.items():
            capped = mirror_step_foreach_(
                descend,
                kernel_base,
                tensors,
                self._scalars(group, lr, key, mirror),
                order=order,
                guard=guard,
                fast=fast,
                mirrored=mirrored,
                norm_cap=norm_cap,
                whole=whole,
                buffers=self._flat_buffers,
            )
            rest += [param for param, done in zip(batch_params, capped) if not done]
        self._after_step(group, rest)


def local_shards(tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """The local shards of DTensors (FSDP2's ``fully_shard``, tensor parallelism) laid out alike.

    The step is elementwise, so each rank updating its shard of the parameter, the gradient
    and the state is the step of the whole tensor; on the shard both paths see a plain tensor.
    Tensors laid out differently (a gradient still ``Partial``, another mesh) stay DTensors and
    take the plain path, whose operators DTensor redistributes (``horst._fast_path.dense_layout``).
    Plain tensors are returned as they are.
    """
    dtensor_module = sys.modules.get("torch.distributed.tensor")  # no DTensor exists before it is imported
    if dtensor_module is None or not isinstance(tensors[0], dtensor_module.DTensor):
        return tensors
    first = tensors[0]
    alike = all(
        isinstance(t, dtensor_module.DTensor)
        and t.device_mesh == first.device_mesh
        and t.placements == first.placements
        for t in tensors
    )
    if not alike or any(placement.is_partial() for placement in first.placements):
        return tensors
    return tuple(t.to_local() for t in tensors)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_non_negative(**values: Any) -> None:
    """``ValueError`` naming the argument unless each value is a finite number >= 0."""
    for name, value in values.items():
        if not is_number(value):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")


def check_betas(betas: Any, *, name: str = "betas") -> None:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{name} must be a pair (beta1, beta2), got {betas!r}")
    for index, value in enumerate(betas):
        if not is_number(value) or not 0.0 <= value < 1.0:
            raise ValueError(f"{name}[{index}] must be in [0, 1), got {value!r}")
