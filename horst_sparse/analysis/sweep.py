"""An alpha x beta sweep's grid and its pick, from the tidy frame of its runs.

The score is the pipeline's headline number, as claims.yaml's `cells` names it: its metric at the
pipeline's method and pattern, from the sparsity `from` on (a ratio-scale metric's geometric mean,
else the mean), better as the metric says: ViT the top-1 (%) of the final sparse model (higher
is better); GPT-2 the geometric mean of the perplexities after magnitude pruning at sparsities
of 50 % and more (lower is better: the perplexity a pruned model is used at). A diverged run (a
non-finite loss) scores NaN and makes its cell worst; failed and cancelled runs measured nothing
and are listed, not scored; a run of the settings and seed of another counts once
(`horst_sparse.analysis.runs.results`). A grid is one optimizer and one signature apart from alpha
and beta: runs that differ in anything else (beyond horst_sparse.training.no_effect) form separate
grids, each named by the keys that differ (`train.epochs=6`), and so do runs scored at other
sparsities (`sparsity=0.8`). Of equal means, the smaller alpha,
then the smaller beta wins.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from horst_sparse.analysis import claims, tables
from horst_sparse.analysis.runs import NoRunsError

GRID_KEYS = ("config.optimizer.alpha", "config.optimizer.beta")


def scores(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per run with alpha and beta: optimizer, grid (signature without alpha/beta), alpha, beta, seed, score."""
    pipelines = frame.pipeline.unique()
    if len(pipelines) > 1:
        raise NoRunsError(f"runs of several pipelines ({', '.join(sorted(pipelines))}): tabulate one sweep at a time")
    runs = frame.dropna(subset=list(GRID_KEYS))
    if runs.empty:
        raise NoRunsError("no HORST or HAM runs (no optimizer.alpha/beta) among these")
    rules = claims.load_rules()
    cell = rules["cells"][pipelines[0]]
    chosen = runs[
        (runs.metric == cell["metric"])
        & (runs.method == cell["method"])
        & (runs.pattern == cell["pattern"])
        & (runs.sparsity >= cell.get("from", 0.0))
    ]
    ratio = rules["metrics"][cell["metric"]]["scale"] == "ratio"
    per_run = chosen.groupby("run")["value"].apply(lambda v: float(np.exp(np.log(v).mean()) if ratio else v.mean()))
    grid_keys = [c for c in runs.columns if c.startswith("config.") and c not in GRID_KEYS]
    first = runs.drop_duplicates("run").set_index("run")
    # the sparsities a run's score is measured at: a table's column key, not in the signature, yet runs at
    # other sparsities (a sparsity sweep) are other grids, never seeds of one
    first["config.sparsity"] = chosen.groupby("run").sparsity.apply(
        lambda s: float(s.iloc[0]) if s.nunique() == 1 else tuple(sorted(s.unique()))
    )
    grid_keys.append("config.sparsity")
    grids = first[grid_keys].apply(lambda row: repr(tuple(row)), axis=1)
    out = pd.DataFrame(
        {
            "optimizer": first["optimizer"],
            "grid": grids,
            "setting": settings(first, grids, grid_keys),
            "alpha": first[GRID_KEYS[0]].astype(float),
            "beta": first[GRID_KEYS[1]].astype(float),
            "seed": first["seed"],
            "score": per_run,
        }
    )
    return out.reset_index()


def settings(first: pd.DataFrame, grids: pd.Series, keys: list[str]) -> pd.Series:
    """Each run's grid named by the config keys whose values tell an optimizer's grids apart
    (`train.epochs=6`; '' where the optimizer has one grid)."""
    labels = pd.Series("", index=first.index, dtype=object)
    for _, runs in first.groupby("optimizer", sort=False):
        if grids[runs.index].nunique() < 2:
            continue
        differ = [k for k in keys if runs[k].map(tables.value_text).nunique() > 1]
        labels[runs.index] = [
            ", ".join(f"{k.removeprefix('config.')}={tables.value_text(v)}" for k, v in zip(differ, row))
            for row in runs[differ].itertuples(index=False)
        ]
    return labels


def cells(runs: pd.DataFrame) -> pd.DataFrame:
    grouped = runs.groupby(["optimizer", "grid", "setting", "alpha", "beta"], sort=True)
    out = (
        grouped["score"]
        .agg(mean=lambda s: s.mean() if s.notna().all() else np.nan, std=lambda s: s.std(ddof=1), n="size")
        .reset_index()
    )
    out["failed"] = grouped["score"].apply(lambda s: int(s.isna().sum())).to_numpy()
    out["seeds"] = grouped["seed"].apply(lambda s: ";".join(map(str, sorted(s)))).to_numpy()
    return out


def pick(grid: pd.DataFrame, *, higher_is_better: bool) -> pd.Series:
    ranked = grid.assign(_key=grid["mean"] * (-1 if higher_is_better else 1)).fillna({"_key": np.inf})
    return ranked.sort_values(["_key", "alpha", "beta"], kind="stable").iloc[0]


def markdown(pipeline: str, grid_cells: pd.DataFrame, command: str) -> str:
    rules = claims.load_rules()
    cell = rules["cells"][pipeline]
    metric = rules["metrics"][cell["metric"]]
    higher = metric["better"] == "higher"
    what = (
        f"{'geometric mean' if metric['scale'] == 'ratio' else 'mean'} {metric['name']} at {cell['method']} "
        f"{cell['pattern']}"
        + (f", sparsities >= {cell['from']:.0%}" if cell.get("from") else "")
        + f", {metric['better']} is better"
    )
    lines = [
        f"# alpha x beta sweep: {pipeline} pipeline",
        "",
        f"Built by `{command}`. Score: {what}. Cells: mean ± sample std [n runs]; not finite: a run "
        "diverged (the cell counts as worst). Bold: the best cell of each grid.",
        "",
    ]
    for (optimizer, _, setting), group in grid_cells.groupby(["optimizer", "grid", "setting"], sort=False):
        best = pick(group, higher_is_better=higher)

        def text(row, best=best) -> str:
            shown = (
                f"not finite ({row.failed} of {row.n})"
                if not np.isfinite(row.mean)
                else f"{tables.number(row.mean, 2)}" + (f" ± {tables.number(row.std, 2)}" if row.n > 1 else "")
            )
            shown += f" [{row.n}]"
            return f"**{shown}**" if (row.alpha, row.beta) == (best.alpha, best.beta) else shown

        shown = group.assign(text=[text(r) for r in group.itertuples()])
        table = shown.pivot(index="alpha", columns="beta", values="text").fillna("")
        table.columns = [f"{b:g}" for b in table.columns]
        table = table.reset_index().rename(columns={"alpha": "alpha \\ beta"})
        table["alpha \\ beta"] = table["alpha \\ beta"].map(lambda a: f"{a:g}")
        title = f"## {optimizer}" + (f" ({setting})" if setting else "")
        lines += [
            title,
            "",
            tables.markdown(table),
            f"Best: alpha = {best.alpha:g}, beta = {best.beta:g} ({tables.number(best['mean'], 2)}, n={best.n}).",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """`horst-sparse sweep-table`: An alpha x beta sweep's table and its pick (horst_sparse.analysis.sweep):

        horst-sparse sweep-table outputs/tuning/vit_* --out results/tuning/vit
        horst-sparse sweep-table outputs/tuning/gpt2_* --out results/tuning/gpt2

    Writes sweep.md (also printed) and sweep.csv (one line per cell) into --out. Tuning trials
    below the given folders are left out unless --tuning (or a given folder is itself inside a
    `tuning/` folder, as above).
    """
    import argparse
    import shlex
    import sys
    from pathlib import Path

    from horst_sparse.analysis.runs import read_runs, results

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="horst-sparse sweep-table",
        description=(main.__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(main.__doc__ or "").split("\n\n", 1)[1],
    )
    parser.add_argument("run_dirs", nargs="+", help="folders searched recursively for run folders")
    parser.add_argument("--out", required=True, help="folder for sweep.md and sweep.csv")
    parser.add_argument(
        "--tuning",
        action="store_true",
        help="include tuning trials (below a tuning/ folder, or setting tune_over or hparams_search)",
    )
    args = parser.parse_args(argv)
    try:
        found = read_runs(args.run_dirs, tuning=args.tuning)
        frame, repeats = results(found.frame)
        if frame.empty:
            raise NoRunsError(f"no finished run under {', '.join(args.run_dirs)}; " + "; ".join(found.left_out[:5]))
        grid = cells(scores(frame))
    except NoRunsError as error:
        sys.exit(f"error: {error}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(frame.pipeline.iloc[0], grid, shlex.join(["horst-sparse", "sweep-table", *argv]))
    notes = found.left_out + repeats
    if notes:
        text += f"\n## Run folders not scored, counted once or scored as diverged ({len(notes)})\n\n"
        text += "".join(f"- {line}\n" for line in notes)
    (out / "sweep.md").write_text(text)
    tables.write_csv(grid, out / "sweep.csv")
    print(text)
