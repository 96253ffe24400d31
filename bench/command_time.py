"""How long a command of the README takes on this machine, as the README states it: one timed run
of the command as typed, with the commit, the machine and the load around it. A command that
fails writes no time (a failed suite's minutes are no suite's).

    python bench/command_time.py --out results/bench/make_test.txt -- make test

The README's "`make test` took N minutes" is the minutes line this writes (tests/test_bench.py
checks that it is). One run, not a median: the suite's time is not a speed target, it tells a reader what
to expect, and its own 2 pytest-xdist processes already fill both cores.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the record here (only when the command succeeds)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command, as typed")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to time after --, e.g. -- make test")
    from horst_sparse.training.run_log import cpu_model, git_commit

    commit, load = git_commit(ROOT), os.getloadavg()[0]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - started
    last = [line for line in done.stdout.splitlines() if line.strip()][-1:] or [""]
    text = "\n".join(
        [
            f"# command: {' '.join(command)}",
            f"# commit {commit}, {datetime.datetime.now().isoformat(timespec='seconds')}",
            f"# {cpu_model()}, {os.cpu_count()} CPUs; 1-minute load average before / after: {load:.1f} / "
            f"{os.getloadavg()[0]:.1f}",
            f"# its last line: {last[0].strip()}",
            f"minutes: {seconds / 60:.1f}",
        ]
    )
    print(text)
    if done.returncode != 0:
        print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
        print(f"error: {' '.join(command)} exited {done.returncode}: no time written", file=sys.stderr)
        return 1
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
