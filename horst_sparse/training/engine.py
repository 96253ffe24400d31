"""The compute engine of a run (`engine`): which kernels carry the same training.

* `reference`: torch's defaults, as every run of protocols v1-v6 ran (`results/fingerprint.json`
  holds its bits).
* `fast`: the same model, data, batches, schedule and evaluation on cheaper CPU kernels; the
  numbers differ from `reference` in floating-point rounding only, and are the same bits on any
  x86 CPU with AVX2 and FMA at the same thread count, as `reference`'s are:

  - every `nn.Linear` (and GPT-2's `Conv1D`) multiplies through oneDNN instead of MKL
    (`_OneDNNLinear`): under the reproducible CPU mode MKL runs its COMPATIBLE branch
    (`MKL_CBWR=COMPATIBLE,STRICT`), several times slower than oneDNN on the small matrices of
    the embedded models (results/bench/engine_profile.md); oneDNN is pinned to AVX2
    (`ONEDNN_MAX_CPU_ISA=AVX2`) by the same mode, as for the convolutions and GELU it already runs
    in both engines (horst_sparse.cpu_mode). A weight's gradient copies the narrower operand (and a
    strided input, the ViT's class token) into rows first (`_weight_gradient`): oneDNN reads a
    transposed operand slowly;
  - a patchifying `nn.Conv2d` (the ViT's patch embedding) as one such product (`PatchConv2d`);
  - timm's attention over short sequences (the ViT's 6 tokens) and exact GELU in the engine's own C
    kernels (`horst_sparse.training.kernels`: fixed flags, own exp and erf, fixed summation order),
    with timm's SDPA and `F.gelu` where a call does not fit them;
  - GPT-2's tanh GELU as torch's one fused kernel, not six elementwise ops (`_fused_gelu_tanh`);
  - the optimizer's fast path (`fused=True`: horst's C kernel on the CPU, built by the system C
    compiler, as the GPT-2 recipe runs it in both engines) instead of the plain eager path;
  - a data set held in memory as tensors (MNIST-1D) is batched by indexing, not item by item
    through a DataLoader (`horst_sparse.vit.data.TrainLoader`): the same batches, bit for bit;
  - a CPU run reseeds only the CPU generator before each ViT batch (`seed_rngs(cpu_only=True)`):
    the same draws, without queueing a seed for every CUDA device.

A run of `fast` names its engine in its signature (`horst_sparse.training.no_effect.SIGNED_UNLESS_DEFAULT`):
the study's cells say which engine made them. `results/bench/engine_cost.txt` (bench/engine_cost.py)
measures the runs per hour of both as the study's multiruns run them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from horst_sparse.training.config import require
from horst_sparse.training.kernels import KernelGELU, short_attention_module

ENGINES = ("reference", "fast")


def check_engine(cfg: Mapping[str, Any]) -> None:
    require(cfg["engine"] in ENGINES, f"engine={cfg['engine']!r} is unknown; use {' or '.join(ENGINES)}")
    if cfg["engine"] == "fast":
        require(
            torch.backends.mkldnn.is_available(),
            "engine=fast multiplies through oneDNN, which this torch build lacks; use engine=reference",
        )


def _onednn_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` of a 2-D `x` and `weight` [out, in] by oneDNN (any strides)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _weight_gradient(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`grad.T @ x` ([out, in]) of `grad` [rows, out] and `x` [rows, in] by oneDNN, which reads a
    transposed operand fastest when the narrower of the two is copied into rows of its own (and
    a strided `x`, such as ViT's class token `x[:, 0]`, slowest of all: copied first)."""
    x = x.contiguous()
    if grad.shape[1] > x.shape[1]:
        return _onednn_matmul(x.t().contiguous(), grad.t()).t().contiguous()
    return _onednn_matmul(grad.t(), x.t())


class _OneDNNLinear(torch.autograd.Function):
    """`F.linear(x, weight, bias)` with the forward and both gradient products in oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        flat = x.reshape(-1, x.shape[-1])
        return _onednn_matmul(flat, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_matmul(grad, weight.t()).view(x.shape)
        if ctx.needs_input_grad[1]:
            grad_weight = _weight_gradient(grad, x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_weight, grad_bias


class OneDNNLinear(torch.nn.Linear):
    """`nn.Linear` through `_OneDNNLinear`: the same parameters, names and state dict."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _OneDNNLinear.apply(x, self.weight, self.bias)


class PatchConv2d(torch.nn.Conv2d):
    """A patchifying `nn.Conv2d` (kernel = stride, no padding, dilation or groups: a ViT's patch
    embedding) as one product of the patches and the flattened weight by `_OneDNNLinear`: the same
    function, the same parameters. The output is the convolution's, laid out channels last (each
    patch's channels together), which is how the ViT reads it (`flatten(2).transpose(1, 2)`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (kh, kw), (height, width) = self.kernel_size, x.shape[-2:]
        if x.dim() != 4 or x.device.type != "cpu" or height % kh or width % kw:
            return super().forward(x)
        batch, channels, rows, cols = x.shape[0], x.shape[1], height // kh, width // kw
        patches = x.reshape(batch, channels, rows, kh, cols, kw).permute(0, 2, 4, 1, 3, 5)
        flat = patches.reshape(batch * rows * cols, channels * kh * kw)
        out = _OneDNNLinear.apply(flat, self.weight.view(self.out_channels, -1), self.bias)
        return out.view(batch, rows, cols, self.out_channels).permute(0, 3, 1, 2)


def _patchifies(conv: torch.nn.Conv2d) -> bool:
    return (
        conv.kernel_size == conv.stride
        and conv.padding == (0, 0)
        and conv.dilation == (1, 1)
        and conv.groups == 1
        and conv.padding_mode == "zeros"
    )


@functools.cache
def _onednn_conv1d(conv1d: type) -> type:
    """Hugging Face's `Conv1D` (GPT-2's linear layers, weight [in, out]) through `_OneDNNLinear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _OneDNNLinear.apply(x, self.weight.t(), self.bias)

    return type("OneDNNConv1D", (conv1d,), {"forward": forward, "__doc__": _onednn_conv1d.__doc__})


@functools.cache
def _fused_gelu_tanh(new_gelu: type) -> type:
    """Hugging Face's `NewGELUActivation` (GPT-2's tanh GELU, six elementwise ops and their six
    backward ones) as the one kernel of `F.gelu(x, approximate="tanh")`: the same function."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh")

    return type("FusedGELUTanh", (new_gelu,), {"forward": forward, "__doc__": _fused_gelu_tanh.__doc__})


# the library modules the fast engine replaces, by (module, class name), so that neither library is imported here
_REPLACEMENTS = {
    ("transformers.pytorch_utils", "Conv1D"): _onednn_conv1d,
    ("transformers.activations", "NewGELUActivation"): _fused_gelu_tanh,
    ("timm.layers.attention", "Attention"): short_attention_module,
}


def use_engine_(model: torch.nn.Module, engine: str) -> torch.nn.Module:
    """`model` with its linear layers on `engine`'s kernels (in place: the modules keep their
    parameters, so optimizer, pruning masks and checkpoints see the same tensors). The engines
    differ on the CPU only: a model on another device is returned as it is."""
    if engine == "reference" or next(model.parameters()).device.type != "cpu":
        return model
    for module in model.modules():
        kind = type(module)
        if kind is torch.nn.Linear:
            module.__class__ = OneDNNLinear
        elif kind is torch.nn.Conv2d and _patchifies(module):
            module.__class__ = PatchConv2d
        elif kind is torch.nn.GELU and module.approximate == "none":
            module.__class__ = KernelGELU
        elif (kind.__module__, kind.__name__) in _REPLACEMENTS:
            module.__class__ = _REPLACEMENTS[kind.__module__, kind.__name__](kind)
    return model


def optimizer_overrides(engine: str) -> dict[str, Any]:
    """Keyword arguments the engine adds to the optimizer's own (configs/optimizer/)."""
    return {"fused": True} if engine == "fast" else {}
