"""Time one optimizer step on GPT-2 Small's parameter set: horst's optimizers vs their baselines.

    python bench/optimizer_step.py [--rounds 5] [--steps 3] [--device cpu]

124M fp32 parameters with random gradients. The optimizers are timed in interleaved rounds
(in a new random order each round) in one process, so machine noise hits all of them alike; the table reports
the median seconds per step and the ratio to each one's baseline (the median over rounds of
the ratio within a round), the target being <= 1.10 on the fast path (on CPU: the C kernel of ``horst/_cpu_kernel.c``):

* HORST and HAM against ``torch.optim.AdamW(fused=True)``;
* HORSTLion against a fused Lion: torch has none, so the baseline is plain Lion in one fused
  pass per tensor, i.e. the same C kernel with the mirror step off (``HORSTLion`` with
  ``alpha = beta = 0``, which is Lion exactly; timm's foreach Lion is listed for scale);
* HORSTSGD (momentum 0.9) against ``torch.optim.SGD(momentum=0.9, fused=True)``.

The first step (state allocation, and building the kernel where no build is cached) is
reported apart. The plain path (``fused=False``) is left out: it is a fallback, tens of
times slower on a model this size.

``--case host-overhead`` times the step off the C kernel, the path CUDA tensors take, at GPT-2
Small's mix of tensors, small enough that the host's work counts: 148 bf16 tensors on CPU, the 50
above ``horst._fast_path.FLAT_NUMEL`` elements (86x768 = 66,048 each, which take the mirror step)
and 98 of 64 elements (alternately 8x8, which take the mirror step, and 64); ``--case
host-overhead-deit`` at DeiT-B's (152 tensors, 51 large). HORST and HAM against
``torch.optim.AdamW(foreach=True)``, target <= 1.2; run it with OMP_WAIT_POLICY=PASSIVE.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time

import _provenance  # bench/, beside this script
import torch
from timm.optim import Lion
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


# (large, small) tensors of each model: the large ones step in place on the compiled path
HOST_OVERHEAD_MIXES = {"host-overhead": (50, 98), "host-overhead-deit": (51, 101)}


def host_overhead_parameters(large: int, small: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    params = []
    for index in range(large + small):
        shape = (86, 768) if index < large else (8, 8) if index % 2 == 0 else (64,)
        param = torch.nn.Parameter(torch.randn(shape, generator=generator).mul_(0.02).bfloat16())
        param.grad = torch.randn(shape, generator=generator).mul_(1e-3).bfloat16()
        params.append(param)
    return params


def gpt2_small_makers(params: list[torch.nn.Parameter], adamw: str, lion: str, sgd: str) -> dict:
    """name: (make, baseline) of the GPT-2 Small case."""
    return {
        adamw: (lambda: torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=True), adamw),
        "AdamW foreach": (lambda: torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, foreach=True), adamw),
        "HAM (fast path)": (lambda: horst.HAM(params, lr=1e-4, weight_decay=0.1, fused=True), adamw),
        "HORST (fast path)": (lambda: horst.HORST(params, lr=1e-4, weight_decay=0.1, fused=True), adamw),
        "HORST sm (fast path)": (lambda: horst.HORST(params, lr=1e-4, weight_decay=0.1, order="sm", fused=True), adamw),
        lion: (lambda: horst.HORSTLion(params, lr=1e-5, weight_decay=0.1, alpha=0.0, beta=0.0, fused=True), lion),
        "Lion foreach (timm)": (lambda: Lion(params, lr=1e-5, weight_decay=0.1, foreach=True), lion),
        "HORSTLion (fast path)": (
            lambda: horst.HORSTLion(params, lr=1e-5, weight_decay=0.1, beta=0.1, fused=True),
            lion,
        ),
        sgd: (lambda: torch.optim.SGD(params, lr=1e-3, momentum=0.9, fused=True), sgd),
        "HORSTSGD (fast path)": (lambda: horst.HORSTSGD(params, lr=1e-3, momentum=0.9, fused=True), sgd),
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps per round and optimizer")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--case", choices=["gpt2-small", *HOST_OVERHEAD_MIXES], default="gpt2-small")
    args = parser.parse_args()
    device = torch.device(args.device)

    adamw, lion, sgd = "AdamW fused", "Lion fused (HORSTLion, alpha=beta=0)", "SGD fused (momentum 0.9)"
    if args.case in HOST_OVERHEAD_MIXES:
        params = host_overhead_parameters(*HOST_OVERHEAD_MIXES[args.case])
        target = 1.2
        foreach = "AdamW foreach"
        # name: (make, baseline)
        makers = {
            foreach: (lambda: torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, foreach=True), foreach),
            "HAM (fast path)": (lambda: horst.HAM(params, lr=1e-4, weight_decay=0.1, fused=True), foreach),
            "HORST (fast path)": (lambda: horst.HORST(params, lr=1e-4, weight_decay=0.1, fused=True), foreach),
        }
    else:
        params = gpt2_small_parameters(device)
        target = 1.1
        makers = gpt2_small_makers(params, adamw, lion, sgd)
    n_params = sum(p.numel() for p in params)
    if args.case in HOST_OVERHEAD_MIXES:
        described = f"{n_params} bf16 params on CPU (the compiled path, CUDA's)"
    else:
        described = f"{n_params / 1e6:.1f}M fp32 params (GPT-2 Small)"
    optimizers, first_step = {}, {}
    for name, (make, _) in makers.items():  # first step: state allocation and compilation
        optimizers[name] = make()
        start = time.perf_counter()
        optimizers[name].step()
        synchronize(device)
        first_step[name] = time.perf_counter() - start

    times: dict[str, list[float]] = {name: [] for name in optimizers}
    names = list(optimizers)
    shuffler = random.Random(0)
    for _ in range(args.rounds):
        # a new random order every round: whoever runs right after a foreach optimizer (which
        # leaves the caches full of dirty lines) pays for it, and a rotation keeps neighbours
        # together (the optimizer listed after foreach AdamW would always pay)
        order = names.copy()
        shuffler.shuffle(order)
        for name in order:
            optimizer = optimizers[name]
            synchronize(device)
            start = time.perf_counter()
            for _ in range(args.steps):
                optimizer.step()
            synchronize(device)
            times[name].append((time.perf_counter() - start) / args.steps)

    medians = {name: statistics.median(samples) for name, samples in times.items()}
    case = "" if args.case == "gpt2-small" else f" --case {args.case}"
    print(f"# bench/optimizer_step.py --rounds {args.rounds} --steps {args.steps} --device {args.device}{case}")
    commit = _provenance.commit()
    print(
        f"# commit {commit}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    print(
        f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, {described}, "
        f"{len(params)} tensors, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(
        f"# s/step: median over {args.rounds} interleaved rounds of {args.steps} steps; ratio: median over the "
        "rounds of s/step / its baseline's in the same round (noise slower than a round cancels); "
        f"target <= {target:.2f} on the fast path"
    )
    print(f"{'optimizer':<38} {'baseline':<38} {'s/step':>7} {'ratio':>6} {'min':>7} {'max':>7} {'1st step (s)':>12}")
    for name, samples in times.items():
        baseline = makers[name][1]
        ratio = statistics.median(t / b for t, b in zip(samples, times[baseline]))
        print(
            f"{name:<38} {baseline:<38} {medians[name]:7.4f} {ratio:6.2f} "
            f"{min(samples):7.4f} {max(samples):7.4f} {first_step[name]:12.1f}"
        )


if __name__ == "__main__":
    main()
