"""The CPU minutes of configs/costs.yaml: the entry points' embedded defaults and the smoke presets,
each run once as a user types it, timed from process start to exit, one at a time.

    python bench/default_runs.py | tee results/bench/default_runs.txt
    python bench/default_runs.py --only smoke      # the smoke presets alone (a quick look)

costs.yaml's CPU entries copy the table's minutes and its machine line (`measured_on`), and
horst-sparse plan prints that machine beside every CPU estimate; tests/test_plan.py checks that
costs.yaml and this record agree. A run's thread count is its own config's (`cpu_threads`),
read back from the run's summary.json, not this script's choice.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _provenance  # bench/, beside this script

ROOT = Path(__file__).resolve().parents[1]

# costs.yaml entry -> the command a user types (configs/costs.yaml: embedded.* and experiments.smoke_*)
RUNS = {
    "embedded.train_vit": ["train_vit.py"],
    "embedded.train_gpt2": ["train_gpt2.py"],
    "experiments.smoke_vit": ["train_vit.py", "experiment=smoke_vit"],
    "experiments.smoke_gpt2": ["train_gpt2.py", "experiment=smoke_gpt2"],
}


def timed(line: list[str]) -> tuple[float, dict]:
    """Wall seconds of one run in a fresh process and the environment its summary.json records."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    with tempfile.TemporaryDirectory(prefix="bench-default-runs-") as scratch:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, *line, f"hydra.run.dir={scratch}"], cwd=ROOT, env=env, capture_output=True, text=True
        )
        elapsed = time.perf_counter() - started
        if done.returncode:
            sys.exit(f"error: python {' '.join(line)} failed: {done.stderr.strip()[-1500:]}")
        summary = json.loads((Path(scratch) / "summary.json").read_text())
    return elapsed, summary["environment"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="only the entries whose name holds this text (e.g. smoke)")
    args = parser.parse_args()
    from horst_sparse.training.run_log import cpu_model

    chosen = {name: line for name, line in RUNS.items() if not args.only or args.only in name}
    load_before = os.getloadavg()[0]
    rows = []
    for name, line in chosen.items():
        seconds, env = timed(line)
        rows.append((name, line, seconds, env.get("cpu_threads", "?")))
    only = f" --only {args.only}" if args.only else ""
    print(f"# command: python bench/default_runs.py{only}")
    print(f"# commit {_provenance.commit()}, {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"# machine: {cpu_model()}, {os.cpu_count()} CPUs")
    print(f"# 1-minute load average before / after: {load_before:.1f} / {os.getloadavg()[0]:.1f}")
    print("# one run each, one at a time, process start to exit; threads: the run's own cpu_threads\n")
    print("| costs.yaml entry | command | torch threads | wall s | minutes |")
    print("|---|---|---:|---:|---:|")
    for name, line, seconds, threads in rows:
        print(f"| {name} | python {' '.join(line)} | {threads} | {seconds:.1f} | {seconds / 60:.1f} |")


if __name__ == "__main__":
    main()
