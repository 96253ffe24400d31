"""What the fast engine (engine=fast, horst_sparse/training/engine.py) saves per embedded run, as
the study pays for it: a cell of the study's ViT and of its GPT-2 over several seeds, as one Hydra
multirun through the joblib launcher with two workers at one thread each on two cores (as
configs/study/embedded_*.yaml run them: loky reuses its workers, so each pays its imports once), in
the reference engine and in the fast one, in interleaved rounds.

    OMP_WAIT_POLICY=PASSIVE python bench/engine_cost.py | tee results/bench/engine_cost.txt
    python bench/engine_cost.py --quick      # a tiny check that the harness runs (seconds, no numbers to keep)

A round runs, for each run and each engine (alternating which engine goes first), one multirun
over the round's seeds (round r of the ViT has seeds 10 + 6r to 15 + 6r in both engines: three
runs a worker, so that a worker's start, paid once in the study's 90-cell sweeps, weighs little),
from the launch of `python train_vit.py -m ...` to its exit. Runs per hour on the two cores = the
seeds / the multirun's wall time. The first table gives each engine's median over the rounds and
the median of the per-round ratio fast / reference (noise slower than a round cancels); min and
max of that ratio say how noisy the machine was. The second gives each engine's final metric over
the seeds (mean and standard deviation): the engines train the same runs up to rounding, so their
results agree within the seeds' spread.

The runs: the ViT on MNIST-1D (HORST, AC/DC at 90 %, the recipe's 40 epochs, HORST_FUSED=0 as the
recipe sets it) and the tiny GPT-2 on pydoc (HORST, the recipe's C kernel; `--gpt2-steps` of the
recipe's 600 updates with a quarter of them warm-up, then its pruning and evaluation on the test
split, as the study's cells run them; shortened to fit the bench in half an hour, which weighs the
final pruning evaluation, where the engines differ least, more than a whole run does).
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
# the study's launcher: two joblib workers, one thread each
COMMON = [
    "optimizer=horst",
    "cpu_threads=1",
    "logging.mode=disabled",
    "resume=never",
    "eval_split=test",
    "hydra/launcher=joblib",
    "hydra.launcher.n_jobs=2",
]
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


def timed_multirun(line: list[str], engine: str, seeds: list[int]) -> tuple[float, list[float]]:
    """Wall seconds of one multirun over `seeds` (launch to exit); its runs' final metrics."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.pop("HORST_CPU_MODE", None)  # the reproducible mode, as the study runs
    with tempfile.TemporaryDirectory(prefix="bench-engine-cost-") as scratch:
        command = [
            sys.executable,
            line[0],
            "-m",
            *line[1:],
            f"engine={engine}",
            f"seed={','.join(map(str, seeds))}",
            f"hydra.sweep.dir={scratch}",
            "hydra.sweep.subdir=${seed}",
        ]
        started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        elapsed = time.perf_counter() - started
        if done.returncode:
            sys.exit(f"error: {' '.join(command[1:])} failed: {done.stderr.strip()[-1500:]}")
        metrics = [final_metric(json.loads(Path(scratch, str(seed), "summary.json").read_text())) for seed in seeds]
    return elapsed, metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=6, help="ViT runs a multirun (three a worker)")
    parser.add_argument("--gpt2-seeds", type=int, default=2, help="GPT-2 runs a multirun (one a worker)")
    parser.add_argument("--gpt2-steps", type=int, default=60, help="of the recipe's 600 updates")
    parser.add_argument("--quick", action="store_true", help="one round of a 4-epoch ViT and a 4-update nano GPT-2")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seeds, args.gpt2_seeds, args.gpt2_steps = 1, 2, 2, 4
    from horst_sparse.cpu_mode import state
    from horst_sparse.training.run_log import cpu_model

    cases = runs(quick=args.quick, gpt2_steps=args.gpt2_steps)
    per_multirun = dict(zip(cases, (args.seeds, args.gpt2_seeds)))
    seconds: dict[tuple[str, str], list[float]] = {(name, engine): [] for name in cases for engine in ENGINES}
    metrics: dict[tuple[str, str], list[float]] = {(name, engine): [] for name in cases for engine in ENGINES}
    # what is measured: the tree at the start
    commit, started, load_before = _provenance.commit(), datetime.datetime.now(), os.getloadavg()[0]
    for round_ in range(args.rounds):
        for name, line in cases.items():
            count = per_multirun[name]
            seeds = list(range(FIRST_SEED + count * round_, FIRST_SEED + count * (round_ + 1)))
            # alternate which engine goes first, so a drift in load hits both alike
            for engine in ENGINES if round_ % 2 == 0 else ENGINES[::-1]:
                elapsed, finals = timed_multirun(line, engine, seeds)
                seconds[name, engine].append(elapsed)
                metrics[name, engine] += finals
    options = (
        " --quick"
        if args.quick
        else f" --rounds {args.rounds} --seeds {args.seeds} --gpt2-seeds {args.gpt2_seeds} --gpt2-steps {args.gpt2_steps}"
    )
    mode = state()
    print(f"# command: OMP_WAIT_POLICY=PASSIVE python bench/engine_cost.py{options}")
    print(f"# commit {commit}, started {started.isoformat(timespec='seconds')}")
    print(
        f"# machine: {cpu_model()}, {os.cpu_count()} CPUs; torch's CPU capability {mode['aten_capability']}, "
        f"reproducible CPU mode {mode['reproducible']}; a multirun through the joblib launcher, two workers, "
        "one torch thread a run"
    )
    print(f"# 1-minute load average before / after: {load_before:.1f} / {os.getloadavg()[0]:.1f}")
    print(
        f"# {args.rounds} interleaved rounds of one multirun per run and engine ({args.seeds} ViT seeds, "
        f"{args.gpt2_seeds} GPT-2 seeds); runs/hour = seeds x 3600 / the multirun's wall time (launch to exit); "
        "ratio: fast / reference runs per hour, per round\n"
    )
    print("| run | reference s | fast s | reference runs/h | fast runs/h | ratio (median) | min | max |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, count in per_multirun.items():
        reference, fast = seconds[name, "reference"], seconds[name, "fast"]
        ratios = [r / f for r, f in zip(reference, fast)]
        ref_s, fast_s = statistics.median(reference), statistics.median(fast)
        print(
            f"| {name} | {ref_s:.1f} | {fast_s:.1f} | {count * 3600 / ref_s:.0f} | {count * 3600 / fast_s:.0f} | "
            f"{statistics.median(ratios):.2f} | {min(ratios):.2f} | {max(ratios):.2f} |"
        )
    print("\n# final metric on the test split over the seeds: mean (standard deviation)\n")
    print("| run | seeds | metric | reference | fast |")
    print("|---|---|---|---:|---:|")
    for name, count in per_multirun.items():
        label = "top-1" if name.startswith("vit") else "dense perplexity"
        cells = []
        for engine in ENGINES:
            values = metrics[name, engine]
            spread = statistics.stdev(values) if len(values) > 1 else float("nan")
            cells.append(f"{statistics.mean(values):.4f} ({spread:.4f})")
        seeds = f"{FIRST_SEED}-{FIRST_SEED + count * args.rounds - 1}"
        print(f"| {name} | {seeds} | {label} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
