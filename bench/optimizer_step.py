"""Time one optimizer step on GPT-2 Small's parameter set: HORST and HAM vs torch's AdamW.

    python bench/optimizer_step.py [--rounds 5] [--steps 3] [--device cpu]

124M fp32 parameters with random gradients. The optimizers are timed in interleaved rounds
(in rotating order) in one process, so machine noise hits all of them alike; the table reports the median
seconds per step and the ratio to ``torch.optim.AdamW(fused=True)``, the target being
<= 1.10 for HORST and HAM on the fast path (on CPU: the C kernel of ``horst/_cpu_kernel.c``).
The first step (state allocation, and building the kernel where no build is cached) is
reported apart. The plain path (``fused=False``) is left out: it is a fallback, tens of
times slower on a model this size.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import horst


def gpt2_small_parameters(device: torch.device) -> list[torch.nn.Parameter]:
    with torch.device("meta"):
        shapes = [p.shape for p in GPT2LMHeadModel(GPT2Config()).parameters()]
    generator = torch.Generator().manual_seed(0)
    params = []
    for shape in shapes:
        param = torch.nn.Parameter(torch.randn(shape, generator=generator).mul_(0.02).to(device))
        param.grad = torch.randn(shape, generator=generator).mul_(1e-3).to(device)
        params.append(param)
    return params


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps per round and optimizer")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)

    params = gpt2_small_parameters(device)
    n_params = sum(p.numel() for p in params)
    makers = {
        "AdamW fused (reference)": lambda: torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=True),
        "AdamW foreach": lambda: torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, foreach=True),
        "HAM (fast path)": lambda: horst.HAM(params, lr=1e-4, weight_decay=0.1, fused=True),
        "HORST (fast path)": lambda: horst.HORST(params, lr=1e-4, weight_decay=0.1, fused=True),
    }
    optimizers, first_step = {}, {}
    for name, make in makers.items():  # first step: state allocation and compilation
        optimizers[name] = make()
        start = time.perf_counter()
        optimizers[name].step()
        synchronize(device)
        first_step[name] = time.perf_counter() - start

    times: dict[str, list[float]] = {name: [] for name in optimizers}
    names = list(optimizers)
    for round_ in range(args.rounds):
        # rotate the order every round: whoever runs after foreach AdamW (which leaves the
        # caches full of dirty lines) would otherwise always pay for it
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            optimizer = optimizers[name]
            synchronize(device)
            start = time.perf_counter()
            for _ in range(args.steps):
                optimizer.step()
            synchronize(device)
            times[name].append((time.perf_counter() - start) / args.steps)

    reference = statistics.median(times["AdamW fused (reference)"])
    print(f"# bench/optimizer_step.py --rounds {args.rounds} --steps {args.steps} --device {args.device}")
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, {n_params / 1e6:.1f}M fp32 params (GPT-2 Small), "
          f"{len(params)} tensors, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"# median over {args.rounds} interleaved rounds of {args.steps} steps; "
          "ratio = s/step / AdamW fused; target <= 1.10 for HORST/HAM fast path")
    print(f"{'optimizer':<26} {'s/step':>9} {'ratio':>7} {'min':>9} {'max':>9} {'first step (s)':>15}")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:<26} {median:9.4f} {median / reference:7.2f} {min(samples):9.4f} "
              f"{max(samples):9.4f} {first_step[name]:15.1f}")


if __name__ == "__main__":
    main()
