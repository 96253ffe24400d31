"""One acceptance run that executes every CUDA path of this project on one GPU (<= 8 minutes
on an H100/H200) and writes what it saw to ``results/bench/gpu.md``.

    python bench/gpu_check.py                          # on a GPU machine -> results/bench/gpu.md
    python bench/gpu_check.py --out $OUT/gpu.md        # anywhere else
    python bench/gpu_check.py --items 1,3              # a subset
    python bench/gpu_check.py --cpu                    # dry run: every item at toy size on CPU

Items (each one time-boxed and fail-soft: an exception is recorded as FAIL with its message
and the next item runs; the report is rewritten after every item, so a killed run keeps
what it finished):

1. HORST, HAM, HORSTLion, HORSTSGD (the ``configs/optimizer/`` settings) with fp32 and bf16
   parameters: 5 steps on the fast path (``fused=True``: ``torch.compile``/Triton on CUDA)
   and on the plain path, each against a float64 run of the plain path. Relative error =
   max over tensors of ||theta - theta_64|| / ||theta_64 - theta_0|| (the error relative
   to the total update). PASS: the compiled path ran (no fallback) and its error is at most
   twice the plain path's plus 1e-3 (fp32) or 5e-2 (bf16, whose rounding exceeds the update). The
   first step's time includes the compilation.
2. One optimizer step on GPT-2 Small's parameter set (the model of configs/model/gpt2_small.yaml,
   random gradients; groups and settings from configs/optimizer/*.yaml through
   ``training.optim.build_optimizer``): HORST and HAM against ``torch.optim.AdamW(fused=True)``,
   interleaved rounds, median of the per-round ratios. Target <= 1.10.
3. GPT-2 Small trained as ``train_gpt2.py compile=true`` does it (bf16 autocast, fp32
   weights, ``torch.compile(model)``, cross-entropy in fp32, grad clip 1.0) for 30 steps on
   random tokens, micro batch 16 x 1024, with AdamW and with HORST: tokens/s (5 warm-up
   steps, then 5 interleaved blocks of 5 steps, medians) and MFU. MFU = achieved model
   FLOP/s / the GPU's peak: ``training.gpt2.model.flops_per_token`` (6 N + 12 L d T per
   token, forward and backward, PaLM appendix B) x tokens/s, divided by
   ``training.env.peak_flops`` (dense bf16 tensor-core peak by GPU name: 989 TFLOP/s for
   H100 SXM/H200). Targets: MFU >= 40 % (H100/H200), HORST/AdamW time ratio <= 1.03.
4. DeiT-small (timm ``deit_small_patch16_224`` from configs/model/deit_small.yaml), synthetic
   images, batch 128, bf16 autocast + channels_last (as ``train_vit.py`` on CUDA): images/s
   with AdamW and HORST; then one AC/DC cycle with ``pruning.Sparsifier`` at 90 % (prune,
   2 masked HORST steps: pruned weights must stay exactly 0; restore, 1 step: they may grow).
5. DDP (nccl; gloo with --cpu) over the GPUs present (1 is fine; 2 processes with --cpu): a
   step runs, DDP's averaged gradients agree with one process's full-batch gradients, and
   the parameters are the same on every rank after a HORST step.
6. The ImageNet loader of ``training.vit.data`` (``TrainLoader``: per-image seeding through
   ``_Seeded``; DeiT's train transform from configs/vit_recipe/deit_imagenet.yaml's ``aug``)
   on a synthetic JPEG folder (500 x 375 images), against plain torchvision ``ImageFolder`` +
   timm ``create_transform`` + a shuffled ``DataLoader`` with the same workers and pinned memory:
   images/s in all and per worker on the host CPU.
7. GPT-2 Small in fp16 with its block matrices 2:4-pruned (``pruning.nm_masks``) and converted
   by ``pruning.to_semi_structured_`` (``torch.sparse.to_sparse_semi_structured``): inference
   tokens/s against the same pruned model dense (and the first block's two MLP matrices alone),
   and the outputs' difference. Needs sm80+ (else, and with --cpu: "skipped: needs a GPU (sm80+)").

Needs torch with CUDA (Triton), transformers, timm, torchvision, hydra-core and omegaconf (the
configs are read as the pipelines read them). The report's header records the command, the
commit (``--commit`` where the copy has no .git), date, host, GPU, and torch/CUDA/driver/NCCL
versions. Expected time on one H200: ~5 minutes, most of it compilation (items 1 and 3);
``--budget`` (480 s) caps the whole run, each item has its own time box.

PASS/FAIL says whether an item's code path ran and gave correct results; its targets (speed)
are listed apart as met or missed. With ``--cpu`` every item runs at toy size (targets not
applicable; item 7 reports "skipped: needs a GPU (sm80+)"): the test suite runs it to keep
this script alive. Exit status 1 if any item failed.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch
import torch.nn.functional as F

try:  # the project's configs need these two; a bare CUDA image may lack them
    import hydra  # noqa: F401  (training.optim.build_optimizer instantiates the YAMLs through it)
    from omegaconf import OmegaConf
except ImportError as missing:
    sys.exit(
        f"gpu_check: the package {missing.name!r} is missing; install hydra-core and omegaconf (where no registry is "
        "reachable, carry their wheels and antlr4-python3-runtime's: see README.md, 'GPU acceptance check')"
    )

import horst
import pruning
from horst import _fast_path
from training.env import autocast, peak_flops, seed_everything
from training.gpt2.model import VOCAB_SIZE, build_model as build_gpt2, flops_per_token
from training.optim import build_optimizer, optimizer_factory

CONFIGS = ROOT / "configs"
DEFAULT_GPU_OUT = ROOT / "results" / "bench" / "gpu.md"
DEFAULT_CPU_OUT = ROOT / "outputs" / "gpu_check_cpu.md"
MIRROR_OPTIMIZERS = ("horst", "ham", "horst_lion", "horst_sgd")  # configs/optimizer/<name>.yaml
LR = {"horst": 1e-3, "ham": 1e-3, "horst_lion": 1e-4, "horst_sgd": 1e-2, "adamw": 1e-3}


# ---------------------------------------------------------------------------------- sizes


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Problem sizes and repeats: the GPU's (defaults) or --cpu's toy ones."""

    fast_path_shapes: tuple = ((4096, 4096), (3072, 768), (768,), (384, 3, 16, 16))
    fast_path_steps: int = 5
    gpt2: dict = dataclasses.field(default_factory=dict)  # overrides of configs/model/gpt2_small.yaml
    step_rounds: int = 10  # item 2: interleaved rounds ...
    step_steps: int = 5  # ... of this many steps per optimizer
    train_batch: int = 16  # item 3: sequences per step (micro batch 16 x 1024, the paper's per GPU)
    train_warmup: int = 5  # 5 warm-up + 5 blocks x 5 timed = 30 steps per optimizer
    train_blocks: int = 5
    train_block_steps: int = 5
    vit: dict = dataclasses.field(default_factory=dict)  # overrides of configs/model/deit_small.yaml
    vit_batch: int = 128
    vit_warmup: int = 3
    vit_blocks: int = 3
    vit_block_steps: int = 4
    images: int = 1280  # item 6
    image_size: tuple = (500, 375)
    loader_batch: int = 32
    loader_repeats: int = 2
    sparse_batch: int = 8  # item 7: sequences of 1024 tokens
    sparse_repeats: int = 10
    compile_backend: str = "inductor"  # item 3's torch.compile backend
    ddp_world: int | None = None  # item 5's processes (None: one per GPU)
    budgets: tuple = (200, 60, 180, 90, 60, 60, 60)  # seconds per item (--budget caps their sum)


GPU_SIZES = Sizes()
CPU_SIZES = Sizes(
    fast_path_shapes=((64, 32), (48,), (8, 3, 4, 4)),
    fast_path_steps=3,
    gpt2=dict(n_layer=2, n_head=2, n_embd=64, n_positions=32),
    step_rounds=2,
    step_steps=1,
    train_batch=2,
    train_warmup=1,
    train_blocks=2,
    train_block_steps=1,
    vit=dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2),
    vit_batch=4,
    vit_warmup=1,
    vit_blocks=2,
    vit_block_steps=1,
    images=24,
    image_size=(48, 40),
    loader_batch=4,
    loader_repeats=1,
    sparse_batch=1,
    sparse_repeats=1,
    compile_backend="aot_eager",  # dynamo and AOT autograd as on the GPU, without inductor's minute of C++ builds
    ddp_world=2,  # the multi-process path
    budgets=(240, 60, 180, 90, 90, 90, 30),
)


@dataclasses.dataclass
class Context:
    device: torch.device
    sizes: Sizes
    cpu: bool

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def seconds(self, fn: Callable[[], Any]) -> float:
        """Wall time of ``fn()`` on the device: CUDA events on a GPU, the clock on the CPU."""
        if self.device.type != "cuda":
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
        self.sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


@dataclasses.dataclass
class Result:
    """One item's outcome: status PASS, FAIL or SKIP; ``summary`` its figures in one line;
    ``details`` more lines; ``targets`` the speed targets, each 'met' or 'missed'."""

    status: str = "PASS"
    summary: str = ""
    details: list[str] = dataclasses.field(default_factory=list)
    targets: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def target(self, name: str, value: float, limit: float, *, at_most: bool, applies: bool = True) -> None:
        if not applies:
            self.targets.append(f"{name} {value:.3g} (target {'<=' if at_most else '>='} {limit:g}: n/a here)")
            return
        met = value <= limit if at_most else value >= limit
        self.targets.append(f"{name} {value:.3g} {'<=' if at_most else '>='} {limit:g}: {'met' if met else 'missed'}")

    def fail(self, why: str) -> None:
        self.status = "FAIL"
        self.details.append(f"FAIL: {why}")


class ItemTimeout(BaseException):
    """An item ran past its time box (a BaseException: no ``except Exception`` swallows it)."""


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def load_node(path: str, **overrides: Any):
    node = OmegaConf.load(CONFIGS / path)
    return OmegaConf.merge(node, overrides) if overrides else node


def median_ratio(numerators: list[float], denominators: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(numerators, denominators))


# ---------------------------------------------------------------------------------- item 1


def _fast_path_run(ctx: Context, name: str, dtype: torch.dtype, fused: bool | None, initial, grads):
    """Parameters after ``len(grads)`` steps of optimizer ``name`` from ``initial`` (cast to
    ``dtype``); returns (params, seconds of the first step, seconds of the later steps)."""
    params = [torch.nn.Parameter(p.to(dtype).clone()) for p in initial]
    for p, p0 in zip(params, initial):
        if p0.dim() == 4:  # a conv weight in channels_last: the fast path's dense-layout case
            p.data = p.data.contiguous(memory_format=torch.channels_last)
    optimizer = optimizer_factory(load_node(f"optimizer/{name}.yaml"))(params, lr=LR[name], fused=fused)
    times = []
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.to(dtype).contiguous(memory_format=torch.channels_last) if g.dim() == 4 else g.to(dtype)
        times.append(ctx.seconds(optimizer.step))
    return params, times[0], sum(times[1:])


def item_fast_path(ctx: Context) -> Result:
    result = Result()
    s = ctx.sizes
    gen = torch.Generator(device=ctx.device).manual_seed(0)
    initial = [torch.randn(shape, generator=gen, device=ctx.device, dtype=torch.float64) * 0.02 for shape in s.fast_path_shapes]
    grads = [[torch.randn(shape, generator=gen, device=ctx.device, dtype=torch.float64) * 1e-3 for shape in s.fast_path_shapes]
             for _ in range(s.fast_path_steps)]  # fmt: skip
    # margin for rounding noise: a sign that flips (Lion) between two correct fp32 runs costs ~1e-4 on 16M weights
    floors = {torch.float32: 1e-3, torch.bfloat16: 5e-2}
    first_steps = []
    rows, worst = [], {torch.float32: [0.0, 0.0], torch.bfloat16: [0.0, 0.0]}  # max error: fast, plain
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in MIRROR_OPTIMIZERS:
            for dtype in (torch.float32, torch.bfloat16):
                # the float64 reference starts from the same (rounded) values and gradients
                start = [p.to(dtype).double() for p in initial]
                rounded = [[g.to(dtype).double() for g in step] for step in grads]
                reference, _, _ = _fast_path_run(ctx, name, torch.float64, False, start, rounded)
                plain, _, plain_rest = _fast_path_run(ctx, name, dtype, False, start, rounded)
                fast, first, fast_rest = _fast_path_run(ctx, name, dtype, True, start, rounded)
                first_steps.append(first)

                def error(run):
                    return max(
                        ((p.double() - r).norm() / (r - p0).norm().clamp_min(1e-30)).item()
                        for p, r, p0 in zip(run, reference, start)
                    )

                e_fast, e_plain = error(fast), error(plain)
                e_between = max(((a.double() - b.double()).norm() / (r - p0).norm().clamp_min(1e-30)).item()
                                for a, b, r, p0 in zip(fast, plain, reference, start))  # fmt: skip
                worst[dtype] = [max(worst[dtype][0], e_fast), max(worst[dtype][1], e_plain)]
                ok = e_fast <= 2 * e_plain + floors[dtype]  # False for NaN
                label = f"{name} {str(dtype).replace('torch.', '')}"
                rows.append(
                    f"| {label} | {e_fast:.2e} | {e_plain:.2e} | {e_between:.2e} | {first:.2f} | "
                    f"{1e3 * fast_rest / max(1, s.fast_path_steps - 1):.3f} | {1e3 * plain_rest / max(1, s.fast_path_steps - 1):.3f} | "
                    f"{'ok' if ok else 'TOO LARGE'} |"
                )
                log(f"  1: {label}: rel. error fast {e_fast:.2e}, plain {e_plain:.2e}; first step {first:.2f} s")
                if not ok:
                    result.fail(f"{label}: fast path error {e_fast:.2e} > 2 x plain {e_plain:.2e} + {floors[dtype]:g}")
    fallbacks = [str(w.message) for w in caught if "fast path failed" in str(w.message)]
    if fallbacks or "torch.compile" in _fast_path._failed:
        result.fail("the fast path fell back: " + "; ".join(fallbacks or sorted(_fast_path._failed)))
    compiled = _fast_path._compiled_kernel.cache_info().currsize > 0  # the torch.compile path ran at all
    if not compiled:
        result.fail("the torch.compile path never ran")
    path = "torch.compile (Triton)" if ctx.device.type == "cuda" else "C kernel (fp32) and torch.compile (bf16)"
    result.details += [
        f"fast path: {path}; {s.fast_path_steps} steps on tensors of shapes {list(s.fast_path_shapes)} "
        "(the 4-D one channels_last); relative error = max over tensors of ||theta - theta_float64|| / "
        "||theta_float64 - theta_0||; in bf16 most steps are below the weights' resolution, so both paths' error "
        "is bf16 rounding and the check is that the fast path's is no larger than the plain path's",
        "",
        "| optimizer dtype | rel. error fast | rel. error plain | fast vs plain | first fast step (s, compile) | "
        "later fast step (ms) | plain step (ms) | check |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    result.summary = (
        f"max rel. error vs float64, fast (plain): fp32 {worst[torch.float32][0]:.1e} ({worst[torch.float32][1]:.1e}), "
        f"bf16 {worst[torch.bfloat16][0]:.1e} ({worst[torch.bfloat16][1]:.1e}); slowest first fast step "
        f"{max(first_steps):.1f} s"
    )
    return result


# ---------------------------------------------------------------------------------- item 2


def gpt2_model(ctx: Context, device: torch.device | None = None) -> torch.nn.Module:
    return build_gpt2(load_node("model/gpt2_small.yaml", **ctx.sizes.gpt2)).to(device or ctx.device)


def item_optimizer_step(ctx: Context) -> Result:
    result = Result()
    s = ctx.sizes
    torch.manual_seed(0)
    model = gpt2_model(ctx)
    prunable = pruning.prunable_parameters(model, "gpt2")
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    names = ("adamw", "horst", "ham")
    optimizers = {n: build_optimizer(load_node(f"optimizer/{n}.yaml"), model, lr=6e-4, prunable_names=prunable.keys())
                  for n in names}  # fmt: skip
    if not optimizers["adamw"].defaults.get("fused"):
        result.fail("configs/optimizer/adamw.yaml did not give a fused AdamW")
    first = {n: ctx.seconds(o.step) for n, o in optimizers.items()}  # state allocation (and compilation)
    for o in optimizers.values():  # warm-up
        o.step()
    times: dict[str, list[float]] = {n: [] for n in names}
    for round_ in range(s.step_rounds):
        order = names[round_ % len(names):] + names[: round_ % len(names)]  # rotating order
        for n in order:
            def steps(o=optimizers[n]):
                for _ in range(s.step_steps):
                    o.step()
            times[n].append(ctx.seconds(steps) / s.step_steps)
    n_params = sum(p.numel() for p in model.parameters())
    result.details.append(
        f"{n_params / 1e6:.1f}M fp32 parameters ({len(list(model.parameters()))} tensors), random gradients; "
        f"{s.step_rounds} interleaved rounds of {s.step_steps} steps per optimizer; groups and settings of "
        "configs/optimizer/{adamw,horst,ham}.yaml through training.optim.build_optimizer"
    )
    for n in names:
        result.details.append(f"{n}: {1e3 * statistics.median(times[n]):.3f} ms per step (median), first step "
                              f"{first[n]:.2f} s")  # fmt: skip
    ratios = {n: median_ratio(times[n], times["adamw"]) for n in ("horst", "ham")}
    for n, ratio in ratios.items():
        result.target(f"{n}/AdamW(fused) step time", ratio, 1.10, at_most=True, applies=not ctx.cpu)
    result.summary = (f"AdamW {1e3 * statistics.median(times['adamw']):.2f} ms; HORST/AdamW {ratios['horst']:.2f}x, "
                      f"HAM/AdamW {ratios['ham']:.2f}x")  # fmt: skip
    return result


# ---------------------------------------------------------------------------------- item 3


def item_gpt2_training(ctx: Context) -> Result:
    result = Result()
    s = ctx.sizes
    torch.manual_seed(0)
    reference = gpt2_model(ctx)
    context = reference.config.n_positions
    dtype = torch.bfloat16
    runs = {}
    for name in ("adamw", "horst"):
        model = copy.deepcopy(reference)
        prunable = pruning.prunable_parameters(model, "gpt2")
        optimizer = build_optimizer(load_node(f"optimizer/{name}.yaml"), model, lr=6e-4, prunable_names=prunable.keys())
        runs[name] = (model, torch.compile(model, backend=s.compile_backend), optimizer)
    del reference
    tokens = torch.randint(0, VOCAB_SIZE, (s.train_batch, context + 1), device=ctx.device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    losses: dict[str, list[float]] = {name: [] for name in runs}

    def train(name: str, steps: int) -> None:
        model, compiled, optimizer = runs[name]
        for _ in range(steps):
            with autocast(ctx.device, dtype):
                logits = compiled(x).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses[name].append(loss.detach())

    warmup = {}
    for name in runs:
        warmup[name] = ctx.seconds(lambda: train(name, s.train_warmup))
        log(f"  3: {name}: {s.train_warmup} warm-up steps (compilation) {warmup[name]:.1f} s")
    times: dict[str, list[float]] = {name: [] for name in runs}
    for block in range(s.train_blocks):
        for name in (("adamw", "horst") if block % 2 == 0 else ("horst", "adamw")):
            times[name].append(ctx.seconds(lambda: train(name, s.train_block_steps)) / s.train_block_steps)
    flops = flops_per_token(runs["adamw"][0], context)
    peak = peak_flops(ctx.device)
    tokens_per_step = s.train_batch * context
    steps = s.train_warmup + s.train_blocks * s.train_block_steps
    result.details.append(
        f"{sum(p.numel() for p in runs['adamw'][0].parameters()) / 1e6:.1f}M parameters, batch {s.train_batch} x {context} "
        f"tokens, bf16 autocast, torch.compile, {steps} steps per optimizer ({s.train_warmup} warm-up, then "
        f"{s.train_blocks} interleaved blocks of {s.train_block_steps}); {flops / 1e9:.3f} GFLOP per token "
        "(training.gpt2.model.flops_per_token: 6 N + 12 L d T)"
    )
    if peak is None:
        result.details.append("MFU: n/a (no peak FLOP/s for this device in training.env.peak_flops)")
    else:
        result.details.append(f"MFU = {flops / 1e9:.3f} GFLOP/token x tokens/s / {peak / 1e12:.0f} TFLOP/s "
                              f"(training.env.peak_flops, dense bf16 peak of {torch.cuda.get_device_name(ctx.device)})")  # fmt: skip
    summary = []
    for name in runs:
        finals = [float(loss) for loss in losses[name]]
        if not all(math.isfinite(v) for v in finals):
            result.fail(f"{name}: non-finite loss {finals}")
        per_s = tokens_per_step / statistics.median(times[name])
        mfu = flops * per_s / peak if peak else None
        result.details.append(
            f"{name}: {per_s:,.0f} tokens/s, {1e3 * statistics.median(times[name]):.1f} ms per step, "
            f"MFU {'n/a' if mfu is None else f'{100 * mfu:.1f} %'}, loss {finals[0]:.3f} -> {finals[-1]:.3f}, "
            f"warm-up (compile) {warmup[name]:.1f} s"
        )
        summary.append(f"{name} {per_s:,.0f} tok/s" + ("" if mfu is None else f" (MFU {100 * mfu:.0f} %)"))
        if mfu is not None:
            result.target(f"{name} MFU", mfu, 0.40, at_most=False, applies=not ctx.cpu)
    ratio = median_ratio(times["horst"], times["adamw"])
    result.target("HORST/AdamW step time", ratio, 1.03, at_most=True, applies=not ctx.cpu)
    result.summary = "; ".join(summary) + f"; HORST/AdamW {ratio:.3f}x"
    return result


# ---------------------------------------------------------------------------------- item 4


def item_deit(ctx: Context) -> Result:
    from training.vit.model import build_model as build_vit

    result = Result()
    s = ctx.sizes
    torch.manual_seed(0)
    node = load_node("model/deit_small.yaml", **s.vit)
    channels_last = ctx.device.type == "cuda" or ctx.cpu  # what train_vit.py does on CUDA; exercised on CPU too
    reference = build_vit(node, num_classes=1000).to(ctx.device)
    if channels_last:
        reference = reference.to(memory_format=torch.channels_last)
    images = torch.randn(s.vit_batch, 3, node.img_size, node.img_size, device=ctx.device)
    images = images.contiguous(memory_format=torch.channels_last)
    targets = torch.randint(0, 1000, (s.vit_batch,), device=ctx.device)
    runs = {}
    for name in ("adamw", "horst"):
        model = copy.deepcopy(reference)
        prunable = pruning.prunable_parameters(model, "vit")
        optimizer = build_optimizer(load_node(f"optimizer/{name}.yaml"), model, lr=1e-3, prunable_names=prunable.keys())
        runs[name] = (model, optimizer, prunable)
    del reference
    losses: list[torch.Tensor] = []

    def train(name: str, steps: int, sparsifier: pruning.Sparsifier | None = None) -> None:
        model, optimizer, _ = runs[name]
        for _ in range(steps):
            with autocast(ctx.device, torch.bfloat16):
                loss = F.cross_entropy(model(images).float(), targets)
            loss.backward()
            if sparsifier is not None:
                sparsifier.mask_grads_()
            optimizer.step()
            if sparsifier is not None:
                sparsifier.apply_masks_()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())

    for name in runs:
        train(name, s.vit_warmup)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for block in range(s.vit_blocks):
        for name in (("adamw", "horst") if block % 2 == 0 else ("horst", "adamw")):
            times[name].append(ctx.seconds(lambda: train(name, s.vit_block_steps)) / s.vit_block_steps)
    per_s = {name: s.vit_batch / statistics.median(t) for name, t in times.items()}
    ratio = median_ratio(times["horst"], times["adamw"])
    patch = runs["horst"][0].patch_embed.proj.weight
    result.details.append(
        f"{node.timm_name} ({sum(p.numel() for p in runs['horst'][0].parameters()) / 1e6:.1f}M parameters, "
        f"img {node.img_size}), batch {s.vit_batch}, bf16 autocast, channels_last={channels_last} "
        f"(patch embedding weight channels_last after HORST steps: "
        f"{patch.is_contiguous(memory_format=torch.channels_last)})"
    )
    if channels_last and not patch.is_contiguous(memory_format=torch.channels_last):
        result.fail("HORST's step lost the channels_last layout of the patch embedding")
    for name in runs:
        result.details.append(f"{name}: {per_s[name]:,.0f} images/s ({1e3 * statistics.median(times[name]):.1f} ms per step)")
    result.target("HORST/AdamW step time", ratio, 1.03, at_most=True, applies=not ctx.cpu)

    # one AC/DC cycle with HORST: prune 90 %, masked steps, restore, one dense step
    model, optimizer, prunable = runs["horst"]
    sparsifier = pruning.Sparsifier(prunable)
    masks = sparsifier.prune(0.9)
    train("horst", 2, sparsifier)
    kept = sum(int(m.sum()) for m in masks.values())
    total = sum(m.numel() for m in masks.values())
    nonzero_pruned = sum(int((w[~masks[n]] != 0).sum()) for n, w in prunable.items())
    zeros = sum(int((w == 0).sum()) for w in prunable.values())
    result.details.append(
        f"AC/DC: pruned {len(prunable)} matrices to {1 - kept / total:.4f} sparsity; after 2 masked HORST steps "
        f"{nonzero_pruned} pruned weights are non-zero (must be 0), {zeros / total:.4f} of the weights are exactly 0"
    )
    if nonzero_pruned or zeros < total - kept:
        result.fail(f"{nonzero_pruned} pruned weights are not exactly 0 after masked steps")
    sparsifier.restore()
    pruning.reset_optimizer_moments(optimizer, prunable)
    train("horst", 1)
    grown = sum(int((w[~masks[n]] != 0).sum()) for n, w in prunable.items())
    result.details.append(f"AC/DC restore + 1 step: {grown / (total - kept):.3f} of the pruned weights grew back")
    if not all(math.isfinite(float(v)) for v in losses):
        result.fail(f"non-finite loss: {[float(v) for v in losses]}")
    result.summary = (f"AdamW {per_s['adamw']:,.0f} img/s, HORST {per_s['horst']:,.0f} img/s ({ratio:.3f}x time); "
                      f"AC/DC zeros exact: {nonzero_pruned == 0}")  # fmt: skip
    return result


# ---------------------------------------------------------------------------------- item 5


def nccl_version() -> str:
    try:
        version = torch.cuda.nccl.version()
        return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception as error:  # noqa: BLE001 - a header field, never a reason to stop
        return f"unknown ({type(error).__name__})"


def _ddp_worker(rank: int, world: int, init: str, backend: str, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60), **kwargs)  # fmt: skip
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)).to(device)
        single = copy.deepcopy(model)
        ddp = DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None)
        gen = torch.Generator().manual_seed(1)
        x, y = torch.randn(8 * world, 64, generator=gen).to(device), torch.randn(8 * world, 10, generator=gen).to(device)
        shard = slice(8 * rank, 8 * (rank + 1))
        F.mse_loss(ddp(x[shard]), y[shard]).backward()  # DDP averages the shards' gradients
        F.mse_loss(single(x), y).backward()  # = the full batch's gradient in one process
        error = max(((a.grad - b.grad).abs().max() / b.grad.abs().max()).item()
                    for a, b in zip(model.parameters(), single.parameters()))  # fmt: skip
        optimizer = horst.HORST(ddp.parameters(), lr=1e-2, fused=True)
        optimizer.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        low, high = flat.clone(), flat.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        spread = (high - low).abs().max().item()
        if rank == 0:
            Path(out).write_text(json.dumps({"grad_error": error, "param_spread": spread, "world": world,
                                             "nccl": nccl_version() if backend == "nccl" else None}))  # fmt: skip
    finally:
        dist.destroy_process_group()


def item_ddp(ctx: Context) -> Result:
    result = Result()
    backend = "nccl" if ctx.device.type == "cuda" else "gloo"
    world = ctx.sizes.ddp_world or torch.cuda.device_count()
    with tempfile.TemporaryDirectory() as tmp:
        init, out = f"file://{tmp}/rendezvous", f"{tmp}/result.json"
        if world == 1:
            _ddp_worker(0, 1, init, backend, out)
        else:
            import torch.multiprocessing as mp

            mp.spawn(_ddp_worker, args=(world, init, backend, out), nprocs=world, join=True)
        got = json.loads(Path(out).read_text())
    result.details.append(
        f"backend {backend} ({'NCCL ' + got['nccl'] if got['nccl'] else 'CPU'}), world size {got['world']} "
        f"({'one process' if world == 1 else f'{world} processes'}); a 2-layer MLP, 8 samples per rank, one "
        "backward through DistributedDataParallel against the full batch in one process, then a HORST step"
    )
    result.details.append(f"max relative gradient difference DDP vs single process: {got['grad_error']:.2e} (<= 1e-5)")
    result.details.append(f"max parameter difference across ranks after the HORST step: {got['param_spread']:.1e} (must be 0)")
    if not got["grad_error"] <= 1e-5:
        result.fail(f"DDP gradients differ from the single-process ones by {got['grad_error']:.2e}")
    if got["param_spread"] != 0:
        result.fail(f"ranks' parameters differ by {got['param_spread']:.2e} after the step")
    result.summary = f"{backend}, world {got['world']}: gradients agree to {got['grad_error']:.1e}"
    return result


# ---------------------------------------------------------------------------------- item 6


def _jpeg_folder(root: Path, count: int, size: tuple[int, int]) -> None:
    """An ImageNet-layout folder (train/ and val/, 8 classes) of smooth random JPEGs."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        for split in ("train",) + (("val",) if i < 8 else ()):
            folder = root / split / f"n{i % 8:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            small = rng.integers(0, 256, (size[1] // 16 + 1, size[0] // 16 + 1, 3), dtype=np.uint8)
            Image.fromarray(small).resize(size, Image.BILINEAR).save(folder / f"img_{i:05d}.JPEG", quality=90)


def item_data(ctx: Context) -> Result:
    from timm.data import create_transform
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    from training.vit.data import TrainLoader, build_datasets

    result = Result()
    s = ctx.sizes
    aug = OmegaConf.to_container(OmegaConf.load(CONFIGS / "vit_recipe" / "deit_imagenet.yaml").aug)
    img_size = 224 if not ctx.cpu else 32
    workers = 2 if ctx.cpu else max(1, min(10, (os.cpu_count() or 2) - 2))  # the recipe's 10 per GPU
    pin = ctx.device.type == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "imagenet"
        started = time.perf_counter()
        _jpeg_folder(root, s.images, s.image_size)
        log(f"  6: {s.images} JPEGs written in {time.perf_counter() - started:.1f} s")
        train = build_datasets({"name": "imagefolder", "root": str(root), "minival_size": 8}, aug, img_size=img_size).train
        project = TrainLoader(train, batch_size=s.loader_batch, seed=0, rank=0, world_size=1, repeated_aug=3,
                              num_workers=workers, pin_memory=pin)  # fmt: skip
        plain_tf = create_transform(
            img_size, is_training=True, scale=tuple(aug["scale"]), hflip=aug["hflip"],
            auto_augment=aug["auto_augment"], interpolation=aug["interpolation"], re_prob=aug["re_prob"],
            re_mode=aug["re_mode"], re_count=aug["re_count"],
        )  # fmt: skip
        plain = DataLoader(ImageFolder(str(root / "train"), transform=plain_tf), batch_size=s.loader_batch, shuffle=True,
                           drop_last=True, num_workers=workers, pin_memory=pin)  # fmt: skip

        def images_per_s(loader) -> float:
            """Images/s from the first batch's arrival (workers started) to the last one's."""
            count, start = 0, None
            for images, _ in loader:
                images = images.to(ctx.device, non_blocking=True)
                if start is None:
                    start = time.perf_counter()
                    continue
                count += images.shape[0]
            ctx.sync()
            return count / (time.perf_counter() - start)

        rates: dict[str, list[float]] = {"project": [], "plain": []}
        for repeat in range(s.loader_repeats):
            rates["project"].append(images_per_s(project.epoch(repeat)))
            rates["plain"].append(images_per_s(plain))
        first = next(iter(project.epoch(0)))[0]
    if tuple(first.shape[1:]) != (3, img_size, img_size):
        result.fail(f"a batch has shape {tuple(first.shape)}")
    if pin and not first.is_pinned():
        result.fail("pin_memory=true gave unpinned batches")
    ours, theirs = statistics.median(rates["project"]), statistics.median(rates["plain"])
    result.details += [
        f"{s.images} synthetic {s.image_size[0]}x{s.image_size[1]} JPEGs, DeiT train transform "
        f"({aug['auto_augment']}, random erasing {aug['re_prob']}) at {img_size} px, batch {s.loader_batch}, "
        f"{workers} workers, pin_memory={pin}, {s.loader_repeats} epochs each (interleaved), timed from the first batch",
        f"training.vit.data.TrainLoader (per-image seeds): {ours:,.0f} images/s ({ours / workers:,.0f} per worker)",
        f"torchvision ImageFolder + timm create_transform + DataLoader(shuffle=True): {theirs:,.0f} images/s "
        f"({theirs / workers:,.0f} per worker)",
    ]
    result.target("TrainLoader/plain images/s", ours / theirs, 0.90, at_most=False, applies=not ctx.cpu)
    result.summary = f"{ours / workers:,.0f} vs plain {theirs / workers:,.0f} images/s per worker ({workers} workers)"
    return result


# ---------------------------------------------------------------------------------- item 7


def _to_semi_structured(model: torch.nn.Module) -> tuple[int, dict]:
    """``pruning.to_semi_structured_`` where the library has it, else the same with torch:
    (layers converted, {layer: why it stayed dense})."""
    if hasattr(pruning, "to_semi_structured_"):
        report = pruning.to_semi_structured_(model)
        return len(report["converted"]), report["skipped"]
    from torch.sparse import to_sparse_semi_structured

    if model.device.type != "cuda":
        raise RuntimeError("2:4 semi-structured kernels need a CUDA GPU (sm80+)")
    converted = 0
    for module in model.modules():  # HF Conv1D computes x @ W: W^T is the linear weight
        if type(module).__name__ == "Conv1D":
            module.weight = torch.nn.Parameter(to_sparse_semi_structured(module.weight.detach().t().contiguous()), requires_grad=False)
            module.forward = (lambda m: lambda x: F.linear(x, m.weight, m.bias))(module)
            converted += 1
    return converted, {}


def item_semi_structured(ctx: Context) -> Result:
    result = Result()
    s = ctx.sizes
    torch.manual_seed(0)
    model = gpt2_model(ctx).half().eval()
    prunable = pruning.prunable_parameters(model, "gpt2")
    masks = pruning.nm_masks(prunable, n=2, m=4, dim=pruning.input_dims(model, prunable))
    pruning.Sparsifier(prunable).set_masks(masks)
    if ctx.device.type != "cuda" or torch.cuda.get_device_capability(ctx.device) < (8, 0):
        try:
            _to_semi_structured(model)
        except RuntimeError as error:
            result.status = "SKIP"
            result.summary = "skipped: needs a GPU (sm80+)"
            result.details.append(f"skipped: needs a GPU (sm80+); on {ctx.device} the conversion raised: {str(error)[:160]}")
            return result
        result.fail("the 2:4 conversion did not refuse a device without sparse tensor cores")
        return result
    if hasattr(pruning, "conv1d_to_linear_"):
        pruning.conv1d_to_linear_(model)  # the dense baseline runs the same nn.Linear layers
    sparse = copy.deepcopy(model)
    converted, left_dense = _to_semi_structured(sparse)
    context = model.config.n_positions
    x = torch.randint(0, VOCAB_SIZE, (s.sparse_batch, context), device=ctx.device)
    with torch.inference_mode():
        dense_out, sparse_out = model(x).logits.float(), sparse(x).logits.float()
        difference = ((sparse_out - dense_out).abs().max() / dense_out.abs().max()).item()
        times: dict[str, list[float]] = {"dense": [], "sparse": []}
        for _ in range(s.sparse_repeats):
            for name, m in (("dense", model), ("sparse", sparse)):
                times[name].append(ctx.seconds(lambda m=m: m(x)))
    tokens = s.sparse_batch * context
    rate = {name: tokens / statistics.median(t) for name, t in times.items()}
    speedup = rate["sparse"] / rate["dense"]
    layer_lines = []
    for name in ("transformer.h.0.mlp.c_fc", "transformer.h.0.mlp.c_proj"):  # the matrices alone
        dense_layer, sparse_layer = model.get_submodule(name), sparse.get_submodule(name)
        if not isinstance(dense_layer, torch.nn.Linear):
            continue
        h = torch.randn(tokens, dense_layer.in_features, device=ctx.device, dtype=torch.float16)
        with torch.inference_mode():
            layer_times = {"dense": [], "sparse": []}
            for _ in range(s.sparse_repeats):
                for kind, layer in (("dense", dense_layer), ("sparse", sparse_layer)):
                    layer_times[kind].append(ctx.seconds(lambda layer=layer: layer(h)))
        dense_s, sparse_s = statistics.median(layer_times["dense"]), statistics.median(layer_times["sparse"])
        layer_lines.append(f"{name} ({dense_layer.in_features} -> {dense_layer.out_features}) alone on {tokens} "
                              f"tokens: dense {1e3 * dense_s:.3f} ms, 2:4 {1e3 * sparse_s:.3f} ms ({dense_s / sparse_s:.2f}x)")  # fmt: skip
    result.details += [
        f"GPT-2 Small fp16, {len(masks)} block matrices 2:4-pruned (pruning.nm_masks), {converted} converted with "
        f"torch.sparse.to_sparse_semi_structured; batch {s.sparse_batch} x {context} tokens, {s.sparse_repeats} repeats",
        f"dense (same pruned weights): {rate['dense']:,.0f} tokens/s; 2:4 sparse: {rate['sparse']:,.0f} tokens/s "
        f"({speedup:.2f}x)",
        f"max |logits difference| / max |logits|: {difference:.1e} (<= 1e-2)",
        *layer_lines,
    ]
    if converted != len(masks):
        result.fail(f"{converted} of {len(masks)} pruned matrices converted; left dense: {left_dense}")
    if not difference <= 1e-2:
        result.fail(f"sparse logits differ from dense by {difference:.2e}")
    result.target("2:4 sparse/dense tokens/s", speedup, 1.0, at_most=False)
    result.summary = f"{speedup:.2f}x dense tokens/s ({converted} layers 2:4), logits agree to {difference:.0e}"
    return result


# ---------------------------------------------------------------------------------- the run

ITEMS: dict[str, tuple[str, Callable[[Context], Result]]] = {
    "1": ("HORST/HAM/HORSTLion/HORSTSGD fast path vs plain and float64", item_fast_path),
    "2": ("optimizer step on GPT-2 Small's parameters vs fused AdamW", item_optimizer_step),
    "3": ("GPT-2 Small, bf16 autocast, torch.compile, 30 steps: tokens/s, MFU", item_gpt2_training),
    "4": ("DeiT-small, bf16 + channels_last: images/s; AC/DC prune/restore", item_deit),
    "5": ("DDP (nccl) step over the GPUs present, gradients agree", item_ddp),
    "6": ("ImageNet loader (DeiT transforms, per-image seeds) vs plain torchvision/timm", item_data),
    "7": ("2:4 semi-structured GPT-2 inference vs dense", item_semi_structured),
}


def run_item(key: str, title: str, fn: Callable[[Context], Result], ctx: Context, budget: float) -> Result:
    """``fn(ctx)`` within ``budget`` seconds; any exception (or the time box) becomes FAIL."""
    log(f"item {key}: {title} (time box {budget:.0f} s)")
    started = time.perf_counter()

    def expire(*_):
        raise ItemTimeout(f"item {key} ran past its time box of {budget:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, budget))
    try:
        result = fn(ctx)
    except (Exception, ItemTimeout) as error:  # fail soft: record it, go on with the next item
        message = f"{type(error).__name__}: {error}".splitlines()[0][:400]
        result = Result(status="FAIL", summary=message, details=[f"FAIL: {message}", "", "```",
                        *traceback.format_exc().strip().splitlines()[-12:], "```"])  # fmt: skip
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    result.seconds = time.perf_counter() - started
    gc.collect()
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    log(f"item {key}: {result.status} in {result.seconds:.1f} s: {result.summary}")
    return result


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()  # fmt: skip
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git checkout)"


def environment(ctx: Context) -> list[str]:
    import timm
    import transformers

    lines = [f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
             f"transformers {transformers.__version__}, timm {timm.__version__}, Python {platform.python_version()}"]  # fmt: skip
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(ctx.device)
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30).stdout.split()[0]  # fmt: skip
        except (OSError, IndexError, subprocess.SubprocessError):
            driver = "unknown"
        try:
            import triton

            triton_version = triton.__version__
        except ImportError:
            triton_version = "missing"
        lines.insert(0, f"GPU: {props.name} x {torch.cuda.device_count()} (compute capability {props.major}.{props.minor}, "
                        f"{props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs)")  # fmt: skip
        lines[1] += f", driver {driver}, NCCL {nccl_version()}, Triton {triton_version}"
    else:
        lines.insert(0, f"device: CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores): "
                        "--cpu dry run at toy sizes, figures are not GPU results")  # fmt: skip
    return lines


def write_report(path: Path, header: list[str], results: dict[str, Result], total: float) -> None:
    lines = ["# GPU acceptance check (`bench/gpu_check.py`)", "", *[f"- {h}" for h in header],
             f"- wall time: {total:.0f} s", "",
             "Status says whether an item's code path ran and gave correct results; targets (speed) are listed apart.",
             "", "| # | item | status | figures | targets |", "|---|---|---|---|---|"]  # fmt: skip
    for key, result in results.items():
        targets = "; ".join(result.targets) or "-"
        cells = (ITEMS[key][0], result.status, result.summary, targets)
        lines.append(f"| {key} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    for key, result in results.items():
        lines += ["", f"## {key}. {ITEMS[key][0]}: {result.status} ({result.seconds:.0f} s)", ""]
        in_code = False
        for line in result.details:  # sentences as a list; tables and code as they are
            in_code ^= line.startswith("```")
            lines.append(line if in_code or not line or line.startswith(("|", "```")) else f"- {line}")
        if result.targets:
            lines += ["", *[f"- target: {t}" for t in result.targets]]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="dry run: every item at toy size on the CPU")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"report path (default {DEFAULT_GPU_OUT.relative_to(ROOT)}; with --cpu {DEFAULT_CPU_OUT.relative_to(ROOT)})")
    parser.add_argument("--items", default=",".join(ITEMS), help="comma-separated items to run (default: all)")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for all items together (default 480)")
    parser.add_argument("--commit", default=None, help="the commit to record where the copy has no .git (default: git's)")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.items.split(",") if k.strip()]
    unknown = [k for k in keys if k not in ITEMS]
    if unknown:
        parser.error(f"unknown items {unknown}; choose from {','.join(ITEMS)}")
    out = (args.out or (DEFAULT_CPU_OUT if args.cpu else DEFAULT_GPU_OUT)).resolve()
    if args.cpu and out == DEFAULT_GPU_OUT.resolve():
        parser.error(f"{DEFAULT_GPU_OUT.relative_to(ROOT)} holds GPU results only; give --cpu another --out")
    if not args.cpu and not torch.cuda.is_available():
        parser.error("no CUDA device: this check is for a GPU machine (use --cpu for the dry run)")

    started = time.perf_counter()
    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    seed_everything(0)  # also allows TF32, as the pipelines do
    ctx = Context(device=device, sizes=CPU_SIZES if args.cpu else GPU_SIZES, cpu=args.cpu)
    header = [
        f"command: `python {' '.join(shlex.quote(a) for a in ['bench/gpu_check.py', *(argv if argv is not None else sys.argv[1:])])}`",
        f"commit: {args.commit or git_commit()}",
        f"date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"host: {platform.node()} ({platform.platform()})",
        *environment(ctx),
    ]
    for line in header:
        log(line)
    results: dict[str, Result] = {}
    for index, key in enumerate(keys):
        left = args.budget - (time.perf_counter() - started)
        budget = min(ctx.sizes.budgets[int(key) - 1], left)
        if budget <= 0:
            results[key] = Result(status="FAIL", summary=f"not run: the {args.budget:.0f} s budget was spent")
        else:
            results[key] = run_item(key, *ITEMS[key], ctx, budget)
        write_report(out, header, results, time.perf_counter() - started)
    log(f"wrote {out} in {time.perf_counter() - started:.0f} s: "
        + ", ".join(f"{k} {r.status}" for k, r in results.items()))  # fmt: skip
    return 1 if any(r.status == "FAIL" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
