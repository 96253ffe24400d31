"""Time the GPT-2 pipeline's own training step (`horst_sparse.gpt2.run.train_step`) with AdamW, HAM, HORST.

    python bench/train_step.py | tee results/bench/train_step.txt
    python bench/train_step.py --device cuda --layers 12 --width 768 --context 1024 --batch 16

Each optimizer steps its own copy of one GPT-2, built, wrapped and stepped as `train_gpt2.py`
builds, wraps and steps it: the padded vocabulary head on CUDA, `torch.compile` of the model and
the loss where the run's `compile` is on (by default on CUDA, as the GPU recipe), bf16 autocast
on CUDA (precision `auto`), the gradient-norm clip, the optimizer as its config composes it (its
default path) and the LR schedule. The three are timed round-robin, so that load from other
processes hits them alike. The table gives the median seconds per step, the ratio to AdamW and
the model FLOPs utilisation (`flops_per_token` x tokens per second / the device's bf16 peak,
`peak_flops`; on CUDA only, or with --peak-tflops). It exits with status 1 where an MFU is below
--mfu-target (make gpu-check) or a ratio is over --ratio-target.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import statistics
import sys
import time

# bench/pruning.py, beside this script, would stand in for the pruning package that the pipeline imports
sys.path.remove(os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

import pruning  # noqa: E402
from horst_sparse.gpt2.model import VOCAB_MULTIPLE, VOCAB_SIZE, build_model, flops_per_token, lm_loss_fn, peak_flops
from horst_sparse.gpt2.run import train_step  # noqa: E402
from horst_sparse.training.distributed import DistInfo, parallelize  # noqa: E402
from horst_sparse.training.env import autocast_dtype  # noqa: E402
from horst_sparse.training.optim import build_optimizer  # noqa: E402
from horst_sparse.training.schedule import build_lr_scheduler  # noqa: E402

OPTIMIZERS = ("adamw", "ham", "horst")


def optimizer_config(name: str):
    """The GPT-2 pipeline's optimizer node, as `train_gpt2.py optimizer=<name>` composes it."""
    from horst_sparse.compose import compose
    from horst_sparse.pipeline import get

    return compose(get("gpt2"), [f"optimizer={name}"]).optimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8, help="windows per micro-batch")
    parser.add_argument("--accum", type=int, default=1, help="micro-batches per update")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="default: on CUDA")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per optimizer (compilation)")
    parser.add_argument("--rounds", type=int, default=15, help="timed steps per optimizer")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak (default: its name's)")
    parser.add_argument("--mfu-target", type=float, default=None, help="fail where an MFU is below this")
    parser.add_argument("--ratio-target", type=float, default=None, help="fail where a ratio to AdamW is over this")
    args = parser.parse_args()
    device = torch.device(args.device)
    compile = device.type == "cuda" if args.compile is None else args.compile
    dtype = autocast_dtype("auto", device)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]

    torch.manual_seed(0)
    model_cfg = OmegaConf.create(
        dict(
            name="bench",
            n_layer=args.layers,
            n_head=max(1, args.width // 64),
            n_embd=args.width,
            n_positions=args.context,
            dropout=0.0,
            tie_word_embeddings=True,
        )
    )
    vocab_multiple = VOCAB_MULTIPLE if device.type == "cuda" else 1  # as the pipeline pads it
    reference = build_model(model_cfg, vocab_multiple=vocab_multiple).to(device)
    loss_fn = lm_loss_fn(VOCAB_SIZE, compile=compile)
    runs = {}
    for name in OPTIMIZERS:
        model = copy.deepcopy(reference)
        prunable = pruning.prunable_parameters(model, "gpt2")
        optimizer = build_optimizer(optimizer_config(name), model, lr=1e-4, prunable_names=prunable.keys())
        scheduler = build_lr_scheduler(optimizer, total_steps=10**6, warmup_steps=0, min_lr=1e-5, warmup_lr=0.0)
        train_model = parallelize(model, "ddp", info=DistInfo(), device=device, compile=compile)
        runs[name] = (train_model, model, optimizer, scheduler)
    tokens = torch.randint(0, VOCAB_SIZE, (args.batch, args.context + 1), device=device)
    micro_batches = [(tokens[:, :-1], tokens[:, 1:])] * args.accum

    def step(train_model, model, optimizer, scheduler, number: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        train_step(
            train_model,
            model,
            optimizer,
            scheduler,
            micro_batches,
            step=number,
            accum=args.accum,
            loss_fn=loss_fn,
            dtype=dtype,
            grad_clip=1.0,
            watch_loss=lambda loss, step: None,
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for run in runs.values():
        for number in range(args.warmup):
            step(*run, number)
    times = {name: [] for name in runs}
    for number in range(args.warmup, args.warmup + args.rounds):
        for name, run in runs.items():
            times[name].append(step(*run, number))

    params = sum(p.numel() for p in reference.parameters())
    tokens_per_step = args.batch * args.accum * args.context
    flops = flops_per_token(reference, args.context) * tokens_per_step
    peak = peak_flops(device, args.peak_tflops)
    print(f"# command: python {' '.join(sys.argv)}")
    print(f"# date: {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(
        f"# torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs ({platform.machine()})"
    )
    if device.type == "cuda":
        print(f"# device {torch.cuda.get_device_name(device)}, autocast {dtype}")
    print(
        f"# 1-minute load average before / after: {load_before:.1f} / {os.getloadavg()[0]:.1f} (other processes slow every row alike)"
    )
    print(
        f"# GPT-2 {args.layers} layers x {args.width} wide, {params / 1e6:.1f}M params, {args.accum} x {args.batch} x "
        f"{args.context} tokens an update, vocabulary padded to {-(-VOCAB_SIZE // vocab_multiple) * vocab_multiple}, "
        f"compile {'on' if compile else 'off'}; median of {args.rounds} round-robin steps after {args.warmup} warm-up steps"
    )
    print(
        f"# MFU: {flops / tokens_per_step / 1e6:.1f} MFLOPs a token x tokens/s / the device's peak "
        f"({'%.1f TFLOP/s' % (peak / 1e12) if peak else 'unknown: no MFU'})"
        + (f"; target >= {args.mfu_target}" if args.mfu_target else "")
        + (f"; ratio target <= {args.ratio_target}" if args.ratio_target else "")
    )
    print()
    print("| optimizer | s/step (median) | min | ratio to AdamW | tokens/s | MFU |")
    print("|---|---:|---:|---:|---:|---:|")
    base = statistics.median(times["adamw"])
    failures = []
    for name, values in times.items():
        median = statistics.median(values)
        mfu = flops / median / peak if peak else None
        print(
            f"| {name} | {median:.4f} | {min(values):.4f} | {median / base:.3f} | {tokens_per_step / median:,.0f} | "
            f"{'n/a' if mfu is None else f'{mfu:.3f}'} |"
        )
        if args.mfu_target and (mfu is None or mfu < args.mfu_target):
            failures.append(f"{name}'s MFU {mfu if mfu is None else round(mfu, 3)} is below {args.mfu_target}")
        if args.ratio_target and median / base > args.ratio_target:
            failures.append(f"{name}'s ratio to AdamW {median / base:.3f} is over {args.ratio_target}")
    if failures:
        sys.exit("bench/train_step.py: " + "; ".join(failures))


if __name__ == "__main__":
    main()
