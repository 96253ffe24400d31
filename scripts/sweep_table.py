"""An alpha x beta sweep's table and its pick: how the defaults of HORST and HAM were chosen.

    python scripts/sweep_table.py outputs/tuning/vit_* --out results/tuning/vit
    python scripts/sweep_table.py outputs/tuning/gpt2_* --out results/tuning/gpt2

Reads the runs' `summary.json` files (as `scripts/make_tables.py` does: runs that differ only
in their seed form one cell, mean ± sample std) and writes into `--out`:

* `sweep.md` (also printed): per optimizer, a grid of alpha (rows) by beta (columns) of the
  selection score, the best cell in bold, and the rule that picked it;
* `sweep.csv`: one line per (optimizer, alpha, beta) with the score, its std and run count.

The selection score is the pipeline's headline number: for the ViT pipeline the top-1 (%) of
the final sparse model (higher is better); for GPT-2 the geometric mean of the validation
perplexities after pruning at the run's sparsities of 50 % and more (lower is better), i.e.
the perplexity a pruned model is used at, not the dense one. Cells whose runs diverged
(a non-finite score) count as worst; of equal means, the smaller alpha, then the smaller
beta wins.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tables import NoRunsError, Run, _fmt, find_runs, model_label  # noqa: E402

PRUNED_FROM = 0.5  # GPT-2: the score averages the perplexities at sparsities >= this


@dataclass
class Cell:
    optimizer: str
    alpha: float
    beta: float
    scores: list[float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores) if all(math.isfinite(s) for s in self.scores) else math.nan

    @property
    def std(self) -> float:
        return statistics.stdev(self.scores) if len(self.scores) > 1 and math.isfinite(self.mean) else 0.0


def score(run: Run) -> float:
    """The run's selection score (see the module docstring); NaN if it diverged."""
    s = run.summary
    if run.pipeline == "vit":
        return math.nan if s.get("top1") is None else 100.0 * s["top1"]
    perplexities = [r["ppl"] for r in s["pruning"]["results"] if r["sparsity"] >= PRUNED_FROM]
    if not perplexities:
        raise NoRunsError(f"{run.folder}: no perplexity at a sparsity >= {PRUNED_FROM}")
    if not all(p is not None and math.isfinite(p) for p in perplexities):
        return math.nan
    return math.exp(statistics.fmean(math.log(p) for p in perplexities))


def collect(runs: list[Run]) -> tuple[str, list[Cell]]:
    """Cells of (optimizer, alpha, beta) over seeds; every run must be of one pipeline and one
    experiment apart from optimizer and seed, or the cells would not be comparable."""
    pipelines = {r.pipeline for r in runs}
    if len(pipelines) > 1:
        raise NoRunsError(f"runs of several pipelines ({', '.join(sorted(pipelines))}): tabulate one sweep at a time")
    models = {model_label(r.summary) for r in runs}
    if len(models) > 1:
        raise NoRunsError(f"runs of several models ({', '.join(sorted(models))}): tabulate one sweep at a time")
    cells: dict[tuple[str, float, float], Cell] = {}
    for run in runs:
        opt = run.summary["optimizer"]
        if "alpha" not in opt:
            continue  # AdamW: no alpha/beta to choose
        key = (opt["name"], float(opt["alpha"]), float(opt["beta"]))
        cells.setdefault(key, Cell(*key, [])).scores.append(score(run))
    if not cells:
        raise NoRunsError("no HORST or HAM runs among these")
    return pipelines.pop(), sorted(cells.values(), key=lambda c: (c.optimizer, c.alpha, c.beta))


def best(cells: list[Cell], higher_is_better: bool) -> Cell:
    def key(cell: Cell) -> float:
        if not math.isfinite(cell.mean):
            return -math.inf
        return cell.mean if higher_is_better else -cell.mean

    return max(cells, key=key)


def markdown(pipeline: str, cells: list[Cell], runs: list[Run], command: str) -> str:
    higher = pipeline == "vit"
    what = (
        "top-1 (%) of the final sparse model, higher is better"
        if higher
        else f"geometric mean of the validation perplexities after one-shot pruning at sparsities >= {PRUNED_FROM:.0%}, lower is better"
    )
    example = runs[0].summary
    lines = [
        f"# alpha x beta sweep: {pipeline} pipeline, {model_label(example)} on {example['data']['name']}",
        "",
        f"Built by `{command}` from {len(runs)} runs. Score: {what}. Cells: mean ± std over seeds [runs];",
        "NaN: a run diverged. Bold: the best cell of each optimizer.",
        "",
    ]
    for optimizer in sorted({c.optimizer for c in cells}):
        mine = [c for c in cells if c.optimizer == optimizer]
        winner = best(mine, higher)
        alphas = sorted({c.alpha for c in mine})
        betas = sorted({c.beta for c in mine})
        lines += [f"## {optimizer}", "", "| alpha \\ beta | " + " | ".join(_fmt(b) for b in betas) + " |",
                  "|---|" + "---:|" * len(betas)]  # fmt: skip
        for alpha in alphas:
            row = []
            for beta in betas:
                cell = next((c for c in mine if (c.alpha, c.beta) == (alpha, beta)), None)
                text = "" if cell is None else f"{cell.mean:.2f} ± {cell.std:.2f} [{len(cell.scores)}]"
                row.append(f"**{text}**" if cell is winner else text)
            lines.append(f"| {_fmt(alpha)} | " + " | ".join(row) + " |")
        lines += ["", f"Best: alpha = {_fmt(winner.alpha)}, beta = {_fmt(winner.beta)} "
                      f"({winner.mean:.2f} ± {winner.std:.2f} over {len(winner.scores)} runs).", ""]  # fmt: skip
    return "\n".join(lines)


def write_csv(cells: list[Cell], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["optimizer", "alpha", "beta", "score_mean", "score_std", "runs"])
        for c in cells:
            writer.writerow([c.optimizer, c.alpha, c.beta, f"{c.mean:.4f}", f"{c.std:.4f}", len(c.scores)])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", help="folders searched recursively for summary.json")
    parser.add_argument("--out", required=True, help="folder for sweep.md and sweep.csv")
    args = parser.parse_args(argv)
    try:
        runs = find_runs(args.run_dirs)
        pipeline, cells = collect(runs)
    except NoRunsError as error:
        sys.exit(f"error: {error}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python scripts/sweep_table.py " + " ".join(args.run_dirs) + f" --out {args.out}"
    text = markdown(pipeline, cells, runs, command)
    (out / "sweep.md").write_text(text + "\n")
    write_csv(cells, out / "sweep.csv")
    print(text)


if __name__ == "__main__":
    main()
