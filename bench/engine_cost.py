"""What the fast engine (engine=fast, horst_sparse/training/engine.py) saves per embedded run: the
study's ViT and GPT-2 runs as the study runs them, two side by side at one thread each on two
cores, in the reference engine and in the fast one, in interleaved rounds.

    OMP_WAIT_POLICY=PASSIVE python bench/engine_cost.py | tee results/bench/engine_cost.txt
    python bench/engine_cost.py --quick      # a tiny check that the harness runs (seconds, no numbers to keep)

A round runs, for each run and each engine (alternating which engine goes first), two fresh
processes at once (two seeds, as joblib's two workers of configs/study/embedded_*.yaml run two
cells; round r has seeds 10 + 2r and 11 + 2r in both engines), each through its entry point from
process start to exit. Runs per hour on the two cores = 2 x 3600 / the pair's wall time (the
slower of the two). The first table gives each engine's median over the rounds and the median of
the per-round ratio fast / reference (noise slower than a round cancels); min and max of that
ratio say how noisy the machine was. The second gives each engine's final metric over the seeds
(mean and standard deviation): the engines train the same runs up to rounding, so their results
agree within the seeds' spread.

The runs: the ViT on MNIST-1D (HORST, AC/DC at 90 %, the recipe's 40 epochs, HORST_FUSED=0 as the
recipe sets it) and the tiny GPT-2 on pydoc (HORST, the recipe's C kernel; `--gpt2-steps` of the
recipe's 600 updates with a quarter of them warm-up, then its pruning and evaluation on the
test split, as the study's cells run them).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _provenance  # bench/, beside this script

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("reference", "fast")
FIRST_SEED = 10  # the study's first reporting seed
COMMON = ["optimizer=horst", "cpu_threads=1", "logging.mode=disabled", "resume=never", "eval_split=test"]
# --quick: 4 epochs, one of each AC/DC phase (configs/experiment/smoke_vit.yaml's schedule)
QUICK_VIT = [
    "train.epochs=4",
    "train.warmup_epochs=1",
    *(
        f"acdc.{phase}=1"
        for phase in ("dense_warmup", "compressed", "decompressed", "final_decompressed", "final_compressed")
    ),
]


# --quick: the nano GPT-2, a few windows of evaluation and calibration
QUICK_GPT2 = ["model=gpt2_nano", "eval.max_windows=4", "train.eval_windows=4", "prune.calibration_windows=4"]


def runs(*, quick: bool, gpt2_steps: int) -> dict[str, list[str]]:
    return {
        f"vit (mnist1d, {4 if quick else 40} epochs)": [
            "train_vit.py",
            "vit_recipe=mnist1d",
            "acdc.sparsity=0.9",
            *(QUICK_VIT if quick else []),
            *COMMON,
        ],
        f"gpt2 (pydoc, {gpt2_steps} updates)": [
            "train_gpt2.py",
            f"train.max_steps={gpt2_steps}",
            f"train.warmup_steps={gpt2_steps // 4}",
            "prune.methods=[magnitude,wanda]",
            "prune.patterns=[unstructured,'2:4']",
            *(QUICK_GPT2 if quick else []),
            *COMMON,
        ],
    }


def final_metric(summary: dict) -> float:
    """A run's reported result: the ViT's top-1, GPT-2's dense perplexity (on eval_split)."""
    return summary["top1"] if summary["pipeline"] == "vit" else summary["ppl"]["0"]


def timed_pair(line: list[str], engine: str, seeds: tuple[int, int]) -> tuple[float, list[float]]:
    """Wall seconds of two runs started at once in fresh processes, until both exit; their final metrics."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.pop("HORST_CPU_MODE", None)  # the reproducible mode, as the study runs
    with tempfile.TemporaryDirectory(prefix="bench-engine-cost-") as scratch:
        started = time.perf_counter()
        processes = [
            subprocess.Popen(
                [sys.executable, *line, f"engine={engine}", f"seed={seed}", f"hydra.run.dir={scratch}/{seed}"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for seed in seeds
        ]
        errors = [p.communicate()[1] for p in processes]
        elapsed = time.perf_counter() - started
        for process, error in zip(processes, errors):
            if process.returncode:
                sys.exit(f"error: python {' '.join(line)} engine={engine} failed: {error.strip()[-1500:]}")
        metrics = [final_metric(json.loads(Path(scratch, str(seed), "summary.json").read_text())) for seed in seeds]
    return elapsed, metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gpt2-steps", type=int, default=120, help="of the recipe's 600 updates")
    parser.add_argument("--quick", action="store_true", help="one round of a 4-epoch ViT and a 4-update nano GPT-2")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.gpt2_steps = 1, 4
    from horst_sparse.cpu_mode import state
    from horst_sparse.training.run_log import cpu_model

    cases = runs(quick=args.quick, gpt2_steps=args.gpt2_steps)
    seconds: dict[tuple[str, str], list[float]] = {(name, engine): [] for name in cases for engine in ENGINES}
    metrics: dict[tuple[str, str], list[float]] = {(name, engine): [] for name in cases for engine in ENGINES}
    load_before = os.getloadavg()[0]
    for round_ in range(args.rounds):
        seeds = (FIRST_SEED + 2 * round_, FIRST_SEED + 2 * round_ + 1)
        for name, line in cases.items():
            # alternate which engine goes first, so a drift in load hits both alike
            for engine in ENGINES if round_ % 2 == 0 else ENGINES[::-1]:
                elapsed, finals = timed_pair(line, engine, seeds)
                seconds[name, engine].append(elapsed)
                metrics[name, engine] += finals
    options = " --quick" if args.quick else f" --rounds {args.rounds} --gpt2-steps {args.gpt2_steps}"
    mode = state()
    print(f"# command: OMP_WAIT_POLICY=PASSIVE python bench/engine_cost.py{options}")
    print(f"# commit {_provenance.commit()}, {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(
        f"# machine: {cpu_model()}, {os.cpu_count()} CPUs; torch's CPU capability {mode['aten_capability']}, "
        f"reproducible CPU mode {mode['reproducible']}; one torch thread a run, two runs side by side"
    )
    print(f"# 1-minute load average before / after: {load_before:.1f} / {os.getloadavg()[0]:.1f}")
    print(
        f"# {args.rounds} interleaved rounds; runs/hour = 2 x 3600 / the wall time of a pair (two seeds at once, "
        "process start to exit); ratio: fast / reference runs per hour, per round\n"
    )
    print("| run | reference s | fast s | reference runs/h | fast runs/h | ratio (median) | min | max |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in cases:
        reference, fast = seconds[name, "reference"], seconds[name, "fast"]
        ratios = [r / f for r, f in zip(reference, fast)]
        ref_s, fast_s = statistics.median(reference), statistics.median(fast)
        print(
            f"| {name} | {ref_s:.1f} | {fast_s:.1f} | {7200 / ref_s:.0f} | {7200 / fast_s:.0f} | "
            f"{statistics.median(ratios):.2f} | {min(ratios):.2f} | {max(ratios):.2f} |"
        )
    last = FIRST_SEED + 2 * args.rounds - 1
    print(f"\n# final metric on the test split over seeds {FIRST_SEED}-{last}: mean (standard deviation)\n")
    print("| run | metric | reference | fast |")
    print("|---|---|---:|---:|")
    for name in cases:
        label = "top-1" if name.startswith("vit") else "dense perplexity"
        cells = []
        for engine in ENGINES:
            values = metrics[name, engine]
            spread = statistics.stdev(values) if len(values) > 1 else float("nan")
            cells.append(f"{statistics.mean(values):.4f} ({spread:.4f})")
        print(f"| {name} | {label} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
