"""Time one GPT-2 training step (forward, backward, clip, optimizer step) with AdamW, HAM, HORST.

    python bench/train_step.py | tee results/bench/train_step.txt
    python bench/train_step.py --device cuda --layers 12 --width 768 --context 1024 --batch 16

All three run in one process on identical copies of a small GPT-2, built and stepped exactly
as `train_gpt2.py` does (fused AdamW; HAM/HORST on their default fast path; on CUDA bf16
autocast with fp32 weights, as its precision `auto`), and are timed round-robin so that load
from other processes hits them alike. The table gives the median seconds per step and the
ratio to AdamW (target: <= 1.05 for HAM and HORST).
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

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

import pruning
from horst_sparse.gpt2.model import build_model
from horst_sparse.training.env import autocast, autocast_dtype
from horst_sparse.training.optim import build_optimizer

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
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per optimizer (compilation)")
    parser.add_argument("--rounds", type=int, default=15, help="timed steps per optimizer")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = autocast_dtype("auto", device)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]

    torch.manual_seed(0)
    model_cfg = OmegaConf.create(
        dict(
            name="bench",
            n_layer=args.layers,
            n_head=max(1, args.width // 32),
            n_embd=args.width,
            n_positions=args.context,
            dropout=0.0,
            tie_word_embeddings=True,
        )
    )
    reference = build_model(model_cfg).to(device)
    runs = {}
    for name in OPTIMIZERS:
        model = copy.deepcopy(reference)
        prunable = pruning.prunable_parameters(model, "gpt2")
        runs[name] = (model, build_optimizer(optimizer_config(name), model, lr=1e-3, prunable_names=prunable.keys()))
    x = torch.randint(0, 50257, (args.batch, args.context + 1), device=device)

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with autocast(device, dtype):
            logits = model(x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for model, optimizer in runs.values():
        for _ in range(args.warmup):
            step(model, optimizer)
    times = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (model, optimizer) in runs.items():
            times[name].append(step(model, optimizer))

    params = sum(p.numel() for p in reference.parameters())
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
        f"# GPT-2 {args.layers} layers x {args.width} wide, {params / 1e6:.1f}M params, batch {args.batch} x "
        f"{args.context} tokens; median of {args.rounds} round-robin steps after {args.warmup} warm-up steps"
    )
    print()
    print("| optimizer | s/step (median) | min | ratio to AdamW |")
    print("|---|---:|---:|---:|")
    base = statistics.median(times["adamw"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.4f} | {min(values):.4f} | {median / base:.3f} |")


if __name__ == "__main__":
    main()
