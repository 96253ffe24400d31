"""An alpha x beta sweep's table and its pick (analysis.sweep):

    python scripts/sweep_table.py outputs/tuning/vit_* --out results/tuning/vit
    python scripts/sweep_table.py outputs/tuning/gpt2_* --out results/tuning/gpt2

Writes sweep.md (also printed) and sweep.csv (one line per cell) into --out.
"""

import argparse
import shlex
import sys
from pathlib import Path

from analysis import sweep, tables
from analysis.runs import NoRunsError, read_runs

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", help="folders searched recursively for run folders")
    parser.add_argument("--out", required=True, help="folder for sweep.md and sweep.csv")
    args = parser.parse_args()
    try:
        frame = read_runs(args.run_dirs).frame
        grid = sweep.cells(sweep.scores(frame))
    except NoRunsError as error:
        sys.exit(f"error: {error}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = sweep.markdown(frame.pipeline.iloc[0], grid, shlex.join(["python", "scripts/sweep_table.py", *sys.argv[1:]]))
    (out / "sweep.md").write_text(text)
    tables.write_csv(grid, out / "sweep.csv")
    print(text)
