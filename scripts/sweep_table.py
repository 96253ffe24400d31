"""An alpha x beta sweep's table and its pick: how the defaults of HORST and HAM were chosen.

    python scripts/sweep_table.py outputs/tuning/vit_* --out results/tuning/vit
    python scripts/sweep_table.py outputs/tuning/gpt2_* --out results/tuning/gpt2

Reads the run folders as `scripts/make_tables.py` does (`config.yaml`, `summary.json`,
`failed.json`) and groups them by their experiment signature (the resolved config minus
seed, logging, resume, the run folder and the keys that change no result: see
make_tables.py's docstring). A grid is one optimizer and one signature apart from
`optimizer.alpha` and `optimizer.beta`; runs that differ in anything else are never averaged
into one cell: they form separate grids, each headed by the keys in which it differs from the
others. Within a cell, the runs are the seeds: mean ± sample std [n] (one run: no std).
Writes into `--out`:

* `sweep.md` (also printed): per grid, alpha (rows) by beta (columns) of the selection score,
  the best cell in bold, and the rule that picked it; then the runs that are in no grid
  (no alpha/beta, e.g. AdamW), the failed runs with their reason, and skipped folders;
* `sweep.csv`: one line per (optimizer, setting, alpha, beta) with the score, its std, the
  run count, the failed/diverged count and the seeds.

The selection score is the pipeline's headline number: for the ViT pipeline the top-1 (%) of
the final sparse model (higher is better); for GPT-2 the geometric mean of the validation
perplexities after pruning at the run's sparsities of 50 % and more (lower is better), i.e.
the perplexity a pruned model is used at, not the dense one. A run that failed (`failed.json`:
non-finite loss, crash) or whose score is not finite makes its cell count as worst; of equal
means, the smaller alpha, then the smaller beta wins.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tables import (  # noqa: E402
    NoRunsError,
    Run,
    _describe,
    _fmt,
    is_paper_row,
    _key,
    _markdown_frame,
    _nothing,
    _relative,
    data_name,
    differing,
    find_runs,
    run_model_label,
    scan,
)

PRUNED_FROM = 0.5  # GPT-2: the score averages the perplexities at sparsities >= this
GRID_KEYS = ("optimizer.alpha", "optimizer.beta")

__all__ = ["Cell", "best", "collect", "find_runs", "score"]


@dataclass
class Cell:
    optimizer: str
    alpha: float
    beta: float
    scores: list[float]
    setting: str = ""  # the keys in which this cell's grid differs from the other grids
    seeds: list[Any] = field(default_factory=list)
    failed: int = 0  # runs that left failed.json (their score is NaN)

    @property
    def n(self) -> int:
        return len(self.scores)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores) if all(math.isfinite(s) for s in self.scores) else math.nan

    @property
    def std(self) -> float:
        """Sample std; NaN for one run (no spread to show) or a non-finite mean."""
        return statistics.stdev(self.scores) if self.n > 1 and math.isfinite(self.mean) else math.nan


def score(run: Run) -> float:
    """The run's selection score (see the module docstring); NaN if it diverged or failed."""
    if run.status == "failed":
        return math.nan
    s = run.summary
    if run.pipeline == "vit":
        return math.nan if s.get("top1") is None else 100.0 * s["top1"]
    perplexities = [r["ppl"] for r in s["pruning"]["results"] if r["sparsity"] >= PRUNED_FROM and is_paper_row(r)]
    if not perplexities:
        raise NoRunsError(f"{run.folder}: no perplexity at a sparsity >= {PRUNED_FROM}")
    if not all(p is not None and math.isfinite(p) for p in perplexities):
        return math.nan
    return math.exp(statistics.fmean(math.log(p) for p in perplexities))


def _grid_signature(run: Run) -> dict[str, Any]:
    return {k: v for k, v in run.signature.items() if k not in GRID_KEYS}


def collect(runs: list[Run]) -> tuple[str, list[Cell]]:
    """Cells of (optimizer, setting, alpha, beta) over seeds, finished and failed runs alike;
    every run must be of one pipeline. Runs without alpha/beta (AdamW) are in no cell."""
    pipelines = {r.pipeline for r in runs}
    if len(pipelines) > 1:
        raise NoRunsError(f"runs of several pipelines ({', '.join(sorted(pipelines))}): tabulate one sweep at a time")
    gridded = [r for r in runs if "alpha" in r.optimizer and "beta" in r.optimizer]
    if not gridded:
        raise NoRunsError("no HORST or HAM runs among these")
    records = []
    for name in sorted({r.optimizer["name"] for r in gridded}):
        mine = [r for r in gridded if r.optimizer["name"] == name]
        keys = differing(list({_key(s): s for s in map(_grid_signature, mine)}.values()))
        for run in mine:
            records.append({
                "optimizer": name, "setting": _describe(_grid_signature(run), keys),
                "alpha": float(run.optimizer["alpha"]), "beta": float(run.optimizer["beta"]),
                "score": score(run), "seed": run.seed, "failed": run.status == "failed",
            })  # fmt: skip
    frame = pd.DataFrame.from_records(records)
    cells = [
        Cell(optimizer, alpha, beta, list(group["score"]), setting, list(group["seed"]), int(group["failed"].sum()))
        for (optimizer, setting, alpha, beta), group in frame.groupby(["optimizer", "setting", "alpha", "beta"], sort=True)
    ]
    for cell in cells:
        if len(set(map(repr, cell.seeds))) < len(cell.seeds):
            print(f"note: {cell.optimizer} alpha={_fmt(cell.alpha)} beta={_fmt(cell.beta)} {cell.setting}: several runs "
                  f"with the same seed ({', '.join(map(str, cell.seeds))}); all are averaged", file=sys.stderr)  # fmt: skip
    return pipelines.pop(), cells


def best(cells: list[Cell], higher_is_better: bool) -> Cell:
    def key(cell: Cell) -> float:
        if not math.isfinite(cell.mean):
            return -math.inf
        return cell.mean if higher_is_better else -cell.mean

    return max(cells, key=key)


def cell_text(cell: Cell) -> str:
    """`96.00 ± 1.41 [n=2]`, `93.00 [n=1]`, `not finite 1 of 2 (1 failed) [n=2]`."""
    if not math.isfinite(cell.mean):
        bad = sum(not math.isfinite(s) for s in cell.scores)
        return f"not finite {bad} of {cell.n}" + (f" ({cell.failed} failed)" if cell.failed else "") + f" [n={cell.n}]"
    if cell.n == 1:
        return f"{cell.mean:.2f} [n=1]"
    return f"{cell.mean:.2f} ± {cell.std:.2f} [n={cell.n}]"


def _spread(cell: Cell) -> str:
    return f"{cell.mean:.2f} over 1 run" if cell.n == 1 else f"{cell.mean:.2f} ± {cell.std:.2f} over {cell.n} runs"


def markdown(pipeline: str, cells: list[Cell], runs: list[Run], command: str, *, skipped: Sequence[tuple[Path, str]] = ()) -> str:
    higher = pipeline == "vit"
    what = (
        "top-1 (%) of the final sparse model, higher is better"
        if higher
        else f"geometric mean of the validation perplexities after one-shot pruning at sparsities >= {PRUNED_FROM:.0%}, lower is better"
    )
    named = [r for r in runs if r.status == "finished"] or runs  # failed runs' configs name no model preset
    models = sorted({f"{run_model_label(r)} on {data_name(r)}" for r in named})
    lines = [
        f"# alpha x beta sweep: {pipeline} pipeline, {', '.join(models)}",
        "",
        f"Built by `{command}` from {len(runs)} runs. Score: {what}. Cells: mean ± sample std over seeds [n runs] "
        "(one run: no std); not finite: a run diverged or failed (the cell counts as worst). "
        "Bold: the best cell of each grid.",
        "",
    ]
    frame = pd.DataFrame([{"optimizer": c.optimizer, "setting": c.setting, "alpha": c.alpha, "beta": c.beta, "cell": c} for c in cells])
    for (optimizer, setting), grid in frame.groupby(["optimizer", "setting"], sort=False):
        mine = list(grid["cell"])
        winner = best(mine, higher)
        table = grid.assign(text=[f"**{cell_text(c)}**" if c is winner else cell_text(c) for c in mine])
        table = table.pivot(index="alpha", columns="beta", values="text").fillna("").sort_index().sort_index(axis=1)
        table.columns = [_fmt(b) for b in table.columns]
        table = table.reset_index().rename(columns={"alpha": "alpha \\ beta"})
        table["alpha \\ beta"] = table["alpha \\ beta"].map(_fmt)
        lines += [f"## {optimizer}" + (f" [{setting}]" if setting else ""), "", *_markdown_frame(table, len(table.columns) - 1)]
        lines += ["", f"Best: alpha = {_fmt(winner.alpha)}, beta = {_fmt(winner.beta)} ({_spread(winner)}).", ""]
    outside = [r for r in runs if not ("alpha" in r.optimizer and "beta" in r.optimizer)]
    failed = [r for r in runs if r.status == "failed"]
    if outside:
        lines += [f"## Runs in no grid ({len(outside)}: no alpha/beta)", ""]
        lines += [f"- {_relative(r.folder, Path.cwd())}: {r.optimizer.get('name')}, seed {r.seed}, "
                  + (f"failed: {r.summary.get('reason')}" if r.status == "failed" else f"score {score(r):.2f}") for r in outside]  # fmt: skip
        lines.append("")
    if failed:
        lines += [f"## Failed runs ({len(failed)})", ""]
        lines += [f"- {_relative(r.folder, Path.cwd())}: {r.optimizer.get('name')} alpha={_fmt(r.optimizer.get('alpha'))} "
                  f"beta={_fmt(r.optimizer.get('beta'))}, seed {r.seed}: exit code {r.summary.get('exit_code')}, "
                  f"step {r.summary.get('step')}: {r.summary.get('reason')}" for r in failed]  # fmt: skip
        lines.append("")
    if skipped:
        lines += [f"## Skipped ({len(skipped)})", ""] + [f"- {_relative(f, Path.cwd())}: {why}" for f, why in skipped] + [""]
    return "\n".join(lines)


def write_csv(cells: list[Cell], path: Path) -> None:
    pd.DataFrame([
        {"optimizer": c.optimizer, "setting": c.setting, "alpha": c.alpha, "beta": c.beta,
         "score_mean": f"{c.mean:.4f}", "score_std": "" if math.isnan(c.std) else f"{c.std:.4f}", "runs": c.n,
         "failed": c.failed, "seeds": ";".join(map(str, c.seeds))}
        for c in cells
    ]).to_csv(path, index=False)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", help="folders searched recursively for summary.json / failed.json / config.yaml")
    parser.add_argument("--out", required=True, help="folder for sweep.md and sweep.csv")
    args = parser.parse_args(argv)
    try:
        found = scan(args.run_dirs)
        runs = found.runs + found.failed
        if not runs:
            raise NoRunsError(_nothing(args.run_dirs))
        pipeline, cells = collect(runs)
    except NoRunsError as error:
        sys.exit(f"error: {error}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python scripts/sweep_table.py " + " ".join(args.run_dirs) + f" --out {args.out}"
    text = markdown(pipeline, cells, runs, command, skipped=found.skipped)
    (out / "sweep.md").write_text(text + "\n")
    write_csv(cells, out / "sweep.csv")
    print(text)


if __name__ == "__main__":
    main()
