"""What the reproducible CPU mode (horst_sparse/cpu_mode.py) costs per run: the study's ViT and GPT-2
runs through their entry points, each in a fresh process in the reproducible mode and in the native
one (HORST_CPU_MODE=native: every library on this CPU's fastest path), timed round-robin.

    OMP_WAIT_POLICY=PASSIVE python bench/cpu_mode.py | tee results/bench/cpu_mode.txt
    python bench/cpu_mode.py --rounds 1 --gpt2-steps 20     # a quick look

The runs are the study's recipes at one thread (as the study and the demo run them): the ViT on
MNIST-1D (HORST, AC/DC at 90 %, the recipe's 40 epochs) and the tiny GPT-2 on pydoc text (HORST, its
C kernel; `--gpt2-steps` of the recipe's 600 updates with a quarter of them warm-up, then its pruning and
evaluation). The table gives
each run's median wall time in each mode and the ratio reproducible / native.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["optimizer=horst", "cpu_threads=1", "logging.mode=disabled", "resume=never"]


def runs(gpt2_steps: int) -> dict[str, list[str]]:
    return {
        "vit (mnist1d, 40 epochs)": ["train_vit.py", "vit_recipe=mnist1d", "acdc.sparsity=0.9", *COMMON],
        f"gpt2 (pydoc, {gpt2_steps} updates)": [
            "train_gpt2.py",
            f"train.max_steps={gpt2_steps}",
            f"train.warmup_steps={gpt2_steps // 4}",
            *COMMON,
        ],
    }


def timed(line: list[str], mode: str) -> float:
    env = {**os.environ, "HORST_CPU_MODE": mode, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory(prefix="bench-cpu-mode-") as scratch:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, *line, f"reproducible_cpu={mode == 'reproducible'}", f"hydra.run.dir={scratch}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        elapsed = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"error: {' '.join(line)} ({mode}) failed: {done.stderr.strip()[-1500:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gpt2-steps", type=int, default=60)
    args = parser.parse_args()
    from horst_sparse.training.run_log import cpu_model, git_commit

    commit = git_commit(ROOT)
    cases = runs(args.gpt2_steps)
    times: dict[tuple[str, str], list[float]] = {
        (name, mode): [] for name in cases for mode in ("reproducible", "native")
    }
    load_before = os.getloadavg()[0]
    for round_ in range(args.rounds):
        for name, line in cases.items():
            # alternate which mode goes first, so a drift in load hits both alike
            for mode in ("reproducible", "native") if round_ % 2 == 0 else ("native", "reproducible"):
                times[name, mode].append(timed(line, mode))
    print(
        f"# command: OMP_WAIT_POLICY=PASSIVE python bench/cpu_mode.py --rounds {args.rounds} --gpt2-steps {args.gpt2_steps}"
    )
    print(f"# commit {commit}, {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"# {cpu_model()}, {os.cpu_count()} CPUs; one torch thread a run, runs one at a time")
    print(f"# 1-minute load average before / after: {load_before:.1f} / {os.getloadavg()[0]:.1f}")
    print(f"# median wall time of {args.rounds} round-robin runs per mode (process start to exit)\n")
    print("| run | reproducible s | native s | ratio reproducible / native |")
    print("|---|---:|---:|---:|")
    for name in cases:
        fixed, native = (statistics.median(times[name, mode]) for mode in ("reproducible", "native"))
        print(f"| {name} | {fixed:.1f} | {native:.1f} | {fixed / native:.3f} |")


if __name__ == "__main__":
    main()
