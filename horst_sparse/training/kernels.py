"""engine=fast's own CPU kernels (`_engine_kernels.c`): self-attention over short sequences and GELU.

torch's SDPA spends its time on a short sequence in blocking and per-(example, head) calls, not
in arithmetic: the embedded ViT's attention ([256, 4 heads, 6 tokens, head dim 8]) costs ~1.7 ms
forward and backward for ~2 MFLOP (results/bench/engine_profile.md). The kernel does the same
function in one pass over timm's qkv projection ([batch, seq, 3, heads, head_dim], read in
place: no permute and no copies) and writes the output as the output projection reads it; its
backward writes the gradient of the qkv projection in the same layout. ATen's exact GELU and its
backward take ~2 ns an element here; the kernel's, ~0.7.

Their bits depend on neither the CPU nor the thread count (the C file's header says how): the
flags are fixed (`FLAGS`: AVX2 and FMA, the reproducible CPU mode's floor; no -march=native, no
-ffast-math, -ffp-contract=off) and exp and erf are the file's own polynomials, not libm's. The
library is built by the system C compiler through horst's build helper (`horst._cpu_kernel.build`:
a cache named by a hash of source, flags and compiler).

`short_attention_module` serves a timm `Attention` whose call fits the kernel (`fits`): float32 on
the CPU, a sequence of at most `MAX_SEQ` tokens and a head of at most `MAX_DIM`, no mask, no
causal flag, no attention dropout in training, no q/k normalisation and no gate; any other call
takes timm's own forward (SDPA). `KernelGELU` serves `nn.GELU()` (exact) on float32 CPU tensors;
any other input takes `F.gelu`.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("_engine_kernels.c")
FLAGS = ["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]
# where SDPA's blocking stops being the cost (per (example, head), the kernel's work grows as seq^2)
MAX_SEQ = 32
MAX_DIM = 64


@functools.cache
def _kernel() -> ctypes.CDLL:
    from horst._cpu_kernel import build

    library = ctypes.CDLL(str(build(SOURCE, FLAGS, stem="horst_sparse_engine")))
    size, pointer, integer = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    library.attention_forward_f32.argtypes = [pointer] * 3 + [size] * 4 + [ctypes.c_float, integer, integer]
    library.attention_backward_f32.argtypes = [pointer] * 4 + [size] * 4 + [ctypes.c_float, integer, integer]
    library.gelu_forward_f32.argtypes = [pointer] * 2 + [size, integer]
    library.gelu_backward_f32.argtypes = [pointer] * 3 + [size, integer]
    for function in ("attention_forward_f32", "attention_backward_f32", "gelu_forward_f32", "gelu_backward_f32"):
        getattr(library, function).restype = None
    return library


def attention_forward(qkv: Tensor, scale: float, *, generic: bool = False) -> tuple[Tensor, Tensor]:
    """(out [batch, seq, heads * dim], probs [batch, heads, seq, seq]) of a contiguous float32 CPU
    `qkv` [batch, seq, 3, heads, dim]; `generic`: the plain loops even for the shape that has
    AVX2 code (the same bits: tests/test_engine.py)."""
    batch, seq, _, heads, dim = qkv.shape
    out = qkv.new_empty(batch, seq, heads * dim)
    probs = qkv.new_empty(batch, heads, seq, seq)
    _kernel().attention_forward_f32(
        qkv.data_ptr(),
        out.data_ptr(),
        probs.data_ptr(),
        batch,
        seq,
        heads,
        dim,
        scale,
        torch.get_num_threads(),
        generic,
    )
    return out, probs


def attention_backward(qkv: Tensor, probs: Tensor, grad: Tensor, scale: float, *, generic: bool = False) -> Tensor:
    """The gradient of `qkv` (its layout) from that of the output (contiguous), given the forward's `probs`."""
    grad_qkv = torch.empty_like(qkv)
    batch, seq, _, heads, dim = qkv.shape
    _kernel().attention_backward_f32(
        qkv.data_ptr(),
        probs.data_ptr(),
        grad.data_ptr(),
        grad_qkv.data_ptr(),
        batch,
        seq,
        heads,
        dim,
        scale,
        torch.get_num_threads(),
        generic,
    )
    return grad_qkv


class _ShortAttention(torch.autograd.Function):
    """softmax(q k^T * scale) v of a qkv projection [batch, seq, 3, heads, dim] -> [batch, seq, heads * dim]."""

    @staticmethod
    def forward(ctx, qkv: Tensor, scale: float) -> Tensor:
        qkv = qkv.contiguous()
        out, probs = attention_forward(qkv, scale)
        ctx.save_for_backward(qkv, probs)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        qkv, probs = ctx.saved_tensors
        return attention_backward(qkv, probs, grad.contiguous(), ctx.scale), None


def short_attention(qkv: Tensor, scale: float) -> Tensor:
    """softmax(q k^T * scale) v per head of `qkv` [batch, seq, 3, heads, dim] (float32, CPU),
    as [batch, seq, heads * dim]."""
    return _ShortAttention.apply(qkv, scale)


def fits(module: torch.nn.Module, x: Tensor, attn_mask: Tensor | None, is_causal: bool) -> bool:
    """Whether timm's `Attention` `module` called on `x` computes what the kernel does."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.dim() == 3
        and x.shape[1] <= MAX_SEQ
        and module.head_dim <= MAX_DIM
        and attn_mask is None
        and not is_causal
        and not (module.training and module.attn_drop.p > 0)
        and isinstance(module.q_norm, torch.nn.Identity)
        and isinstance(module.k_norm, torch.nn.Identity)
        and getattr(module, "gate", None) is None
    )


@functools.cache
def short_attention_module(attention: type) -> type:
    """timm's `Attention` with its attention in the kernel where the call `fits`, else its own forward."""

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        if not fits(self, x, attn_mask, is_causal):
            return attention.forward(self, x, attn_mask=attn_mask, is_causal=is_causal)
        batch, seq, _ = x.shape
        qkv = self.qkv(x).view(batch, seq, 3, self.num_heads, self.head_dim)
        x = self.norm(short_attention(qkv, self.scale))
        return self.proj_drop(self.proj(x))

    return type("ShortAttention", (attention,), {"forward": forward, "__doc__": short_attention_module.__doc__})


class _GELU(torch.autograd.Function):
    """Exact GELU, x * Phi(x), of a float32 CPU tensor."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        _kernel().gelu_forward_f32(x.data_ptr(), y.data_ptr(), x.numel(), torch.get_num_threads())
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = torch.empty_like(x)
        _kernel().gelu_backward_f32(
            x.data_ptr(), grad.data_ptr(), grad_x.data_ptr(), x.numel(), torch.get_num_threads()
        )
        return grad_x


def gelu(x: Tensor) -> Tensor:
    """`F.gelu(x)` (exact) through the kernel where `x` is a float32 CPU tensor, else `F.gelu`."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and type(x) is torch.Tensor:
        return _GELU.apply(x)
    return torch.nn.functional.gelu(x)


class KernelGELU(torch.nn.GELU):
    """`nn.GELU()` (exact) through `gelu`."""

    def forward(self, x: Tensor) -> Tensor:
        return gelu(x)
