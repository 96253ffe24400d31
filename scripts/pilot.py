"""The pilot that admits a ViT benchmark to the study: dense top-1 at most 95 % and
AdamW losing at least 3 points at 90 % sparsity against its own dense run, on validation.

    python scripts/pilot.py                      # MNIST-1D: adamw and horst x sparsity 0/0.7/0.8/0.9 x seeds 0-1
    python scripts/pilot.py --jobs 2 --seeds 0 1 2

Each cell is one `train_vit.py` run (the command is in the table); finished runs (a
`summary.json` in their folder) are not rerun. Writes `results/embedded/pilot.md` with the
commit, machine and threads, and refuses to start from a tree with uncommitted changes to
tracked files (the numbers must come from a clean commit).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The optimizers at the digits recipe's values, not tuned for MNIST-1D: the mnist1d recipe's `tuned`
# node (lr, warm-up, decay, betas, alpha/beta) replaced by the digits recipe's, read by Hydra from
# configs/tuned/vit/digits.yaml (a section per optimizer) as every digits run reads them.
UNTUNED = "tuned/vit@tuned=digits"
OPTIMIZERS = {name: [f"optimizer={name}", UNTUNED] for name in ("adamw", "horst")}
DENSE_MAX, ADAMW_LOSS_MIN = 0.95, 0.03


def command(optimizer: str, sparsity: float, seed: int, out: Path) -> list[str]:
    return [
        "python",
        "train_vit.py",
        "vit_recipe=mnist1d",
        *OPTIMIZERS[optimizer],
        f"acdc.sparsity={sparsity:g}",
        f"seed={seed}",
        "eval_split=validation",
        "logging.mode=disabled",
        f"hydra.run.dir={out / optimizer / f's{sparsity:g}' / f'seed{seed}'}",
    ]


def values(optimizer: str) -> str:
    """The values a cell of `optimizer` runs at, as train_vit.py composes them (for the report)."""
    from horst_sparse import compose, pipeline

    cfg = compose.compose(pipeline.get("vit"), ["vit_recipe=mnist1d", *OPTIMIZERS[optimizer]])
    o, t = cfg.optimizer, cfg.train
    named = {
        "lr": t.base_lr,
        "warm-up epochs": t.warmup_epochs,
        "decay": o.weight_decay,
        "alpha": o.get("alpha"),
        "beta": o.get("beta"),
    }
    return f"{optimizer} " + ", ".join(f"{k} {v:g}" for k, v in named.items() if v is not None)


def run_cell(argv: list[str]) -> dict:
    """Run one cell (unless done); its summary with the CPU seconds the process used."""
    run_dir = Path(argv[-1].split("=", 1)[1])
    done = run_dir / "summary.json"
    if not done.is_file():
        log = run_dir.with_name(f"{run_dir.name}.log")  # the run's output (a pipe nobody reads would fill and stall it)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as output:
            process = subprocess.Popen([sys.executable, *argv[1:]], cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(process.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"error: {shlex.join(argv)} failed; its output: {log}")
        (run_dir / "cpu_seconds.txt").write_text(f"{usage.ru_utime + usage.ru_stime:.1f}\n")
    summary = json.loads(done.read_text())
    measured = run_dir / "cpu_seconds.txt"  # absent for a run whose pilot process was stopped before it ended
    summary["cpu_seconds"] = float(measured.read_text()) if measured.is_file() else None
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.0, 0.9, 0.7, 0.8], help="run in this order")
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side (each on one thread)")
    parser.add_argument("--out", type=Path, default=Path("outputs/pilot/mnist1d"))
    parser.add_argument("--report", type=Path, default=ROOT / "results" / "embedded" / "pilot.md")
    args = parser.parse_args(argv)

    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()  # noqa: E731
    if git("status", "--porcelain", "--untracked-files=no"):
        raise SystemExit(
            "error: the tree has uncommitted changes to tracked files; commit them first (the pilot's numbers must come from a clean commit)"
        )
    commit, started = git("rev-parse", "--short", "HEAD"), time.time()
    untuned = "; ".join(values(o) for o in OPTIMIZERS)
    cells = [(o, s, k) for s in args.sparsities for o in OPTIMIZERS for k in args.seeds]  # in the order given
    with ThreadPoolExecutor(args.jobs) as pool:
        summaries = list(pool.map(lambda c: run_cell(command(*c, args.out)), cells))
    top1 = {(o, s): [] for o, s, _ in sorted(cells)}
    for (o, s, _), summary in zip(cells, summaries):
        top1[o, s].append(summary["top1"])
    mean = {key: statistics.fmean(values) for key, values in top1.items()}
    dense, sparse = mean["adamw", 0.0], mean["adamw", 0.9]
    admitted = dense <= DENSE_MAX and dense - sparse >= ADAMW_LOSS_MIN
    cpu = [s["cpu_seconds"] for s in summaries if s["cpu_seconds"] is not None]

    lines = [
        "# Pilot: does MNIST-1D separate the optimizers? (ViT, AC/DC)",
        "",
        f"Generated by `python scripts/pilot.py {' '.join(sys.argv[1:] if argv is None else argv)}` at clean commit `{commit}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {(time.time() - started) / 60:.1f} min; "
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores ({platform.processor() or 'unknown CPU'}), "
        f"Python {platform.python_version()}; {args.jobs} runs side by side, each on 1 torch thread (`cpu_threads: 1`, "
        f"plain optimizer path). Load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}.",
        "",
        "Rule: keep the benchmark if dense top-1 <= 95 % and AdamW at 90 % loses >= 3 points against its "
        "dense run; measured on the validation split (1,000 examples; the study reports on the 5,000 test examples). "
        f"The optimizers run at the digits recipe's values (configs/tuned/vit/digits/: {untuned}), not tuned here.",
        "",
        f"**Verdict: {'admitted' if admitted else 'not admitted'}**: AdamW dense {dense:.2%}, at 90 % {sparse:.2%} "
        f"(loses {100 * (dense - sparse):.1f} points).",
        "",
        "| optimizer | sparsity | top-1 (mean) | per seed |",
        "|---|---:|---:|---|",
        *(f"| {o} | {s:g} | {mean[o, s]:.2%} | {', '.join(f'{v:.3f}' for v in top1[o, s])} |" for o, s in top1),
        "",
        f"Cost of one run (4,000 training examples, 40 epochs, 600 updates): CPU time per run (user + system of the "
        f"process, start-up included) median {statistics.median(cpu):.0f} s, range {min(cpu):.0f}-{max(cpu):.0f} s, "
        f"over {len(cpu)} runs on a shared machine (wall time per run: median "
        f"{statistics.median(s['train']['wall_time_s'] for s in summaries):.0f} s under that load).",
        "",
        "Each cell: `python train_vit.py vit_recipe=mnist1d <optimizer> acdc.sparsity=<s> seed=<k> eval_split=validation "
        f"logging.mode=disabled hydra.run.dir={args.out}/<name>/s<s>/seed<k>`, with `<optimizer>` "
        + "; ".join(f"{o}: `{' '.join(v)}`" for o, v in OPTIMIZERS.items())
        + ".",
    ]
    args.report.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
