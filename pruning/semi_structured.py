"""Run 2:4-pruned linear layers on sparse tensor cores (CUDA only).

``torch.sparse.to_sparse_semi_structured`` stores a 2:4-sparse weight compressed (half the
values plus 2-bit indices) and dispatches ``F.linear`` to cuSPARSELt or CUTLASS kernels on
NVIDIA GPUs of compute capability 8.0 or newer (Ampere, Hopper, ...). On a CPU there is no
such kernel: a 2:4-pruned model there is a dense model with zeros, exact in its outputs and
no faster.

HF ``Conv1D`` (GPT-2) computes ``x @ W`` with W [in, out]; it is first replaced by an
``nn.Linear`` holding W^T [out, in], whose 2:4 groups (along the input dimension) are then
contiguous along rows as the kernels require.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from .selection import _is_instance

GPU_NEEDED = (
    "2:4 semi-structured sparse kernels (torch.sparse.to_sparse_semi_structured) need a CUDA GPU with "
    "sparse tensor cores (compute capability 8.0 or newer: A100, H100, RTX 30xx/40xx)"
)


def is_nm_sparse(weight: Tensor, *, n: int = 2, m: int = 4, dim: int = 1) -> bool:
    """Whether every group of ``m`` consecutive entries along ``dim`` has at most ``n``
    non-zeros (the input dimension: 1 for ``nn.Linear``, 0 for ``Conv1D``)."""
    moved = weight.detach().movedim(dim, -1)
    if moved.shape[-1] % m:
        return False
    groups = moved.reshape(*moved.shape[:-1], -1, m)
    return bool(((groups != 0).sum(-1) <= n).all())


def conv1d_to_linear_(model: nn.Module, names: Iterable[str] | None = None) -> list[str]:
    """Replace HF ``Conv1D`` modules (all, or those named) by equivalent ``nn.Linear``
    modules (weight transposed, same device and dtype, same outputs); returns their names."""
    wanted = None if names is None else set(names)
    replaced = []
    for name, module in list(model.named_modules()):
        if not _is_instance(module, ("Conv1D",)) or (wanted is not None and name not in wanted):
            continue
        weight = module.weight  # [in, out]
        linear = nn.Linear(
            weight.shape[0], weight.shape[1], bias=module.bias is not None, device=weight.device, dtype=weight.dtype
        )
        with torch.no_grad():
            linear.weight.copy_(weight.t())
            if module.bias is not None:
                linear.bias.copy_(module.bias)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, linear)
        replaced.append(name)
    return replaced


def to_semi_structured_(model: nn.Module, names: Iterable[str] | None = None) -> dict:
    """Convert the 2:4-sparse linear layers of ``model`` (those named by module name, or
    every ``nn.Linear``/``Conv1D`` whose weight is 2:4 along its inputs) to
    ``torch.sparse.to_sparse_semi_structured`` weights, in place, for inference.

    The model must be on a CUDA GPU of compute capability 8.0+ in float16 or bfloat16 (the
    kernels' dtypes); a CPU model raises a ``RuntimeError`` saying so. A named layer that
    is not 2:4 sparse raises ``ValueError``. Layers whose shape the kernels do not take
    (e.g. smaller than 32 x 64) stay dense. Returns ``{"converted": [names], "skipped":
    {name: reason}}``."""
    device = next(model.parameters()).device
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(
            f"{GPU_NEEDED}; this model is on {device}. On a CPU the pruned model runs dense with exact zeros: "
            "the same outputs, no speed-up (make gpu-check checks the converted outputs on a GPU)."
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 0):
        raise RuntimeError(f"{GPU_NEEDED}; {torch.cuda.get_device_name(device)} has compute capability {capability}")
    from torch.sparse import to_sparse_semi_structured

    wanted = None if names is None else set(names)
    candidates = {}
    for name, module in model.named_modules():
        if not (isinstance(module, nn.Linear) or _is_instance(module, ("Conv1D",))):
            continue
        if wanted is not None and name not in wanted:
            continue
        dim = 0 if _is_instance(module, ("Conv1D",)) else 1
        if not is_nm_sparse(module.weight, dim=dim):
            if wanted is not None:
                raise ValueError(f"{name}.weight is not 2:4 sparse along its inputs; prune it with pattern '2:4' first")
            continue
        candidates[name] = module
    if wanted is not None and (missing := wanted - set(candidates)):
        raise ValueError(f"no linear layer named {sorted(missing)[:4]} in the model")
    conv1d_to_linear_(model, [n for n, m in candidates.items() if not isinstance(m, nn.Linear)])
    converted, skipped = [], {}
    for name in candidates:
        linear = model.get_submodule(name)
        try:
            sparse = to_sparse_semi_structured(linear.weight.detach())
        except RuntimeError as error:  # shape or dtype the kernels do not take
            skipped[name] = str(error).splitlines()[0]
            continue
        linear.weight = nn.Parameter(sparse, requires_grad=False)
        converted.append(name)
    return {"converted": converted, "skipped": skipped}
