"""Tuning curves: how good an arm's best validation score is after k = 1..n trials of its search,
with simultaneous confidence bands (Lourie, Cho and He, "Show Your Work with Confidence", 2024,
through their package `opda`). An equal trial count is a fair comparison only at the budget it
fixes: the curves show whether the arms' order holds at every budget or turns on the one chosen.

From a tuning record (`results/tuning/<pipeline>/<recipe>/tuning.csv`: one row per trial of each
arm) per arm: the median tuning curve (the median of the best score of k trials drawn from the
arm's search distribution) with its simultaneous band at CONFIDENCE, from the band of the
scores' CDF (opda's `ld_highest_density`), and the expected best of k trials (the average tuning
curve of the empirical distribution). A failed trial scores the worst end of the support.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from horst_sparse.analysis import tables

CONFIDENCE = 0.80
BAND_SEED = 0  # opda's band construction draws samples: a fixed generator, the same band every time


def arm_curve(scores: np.ndarray, *, maximize: bool, support: tuple[float, float]) -> pd.DataFrame:
    """k, median, low, high, expected of one arm's trial scores."""
    from opda.nonparametric import EmpiricalDistribution

    low_end, high_end = support
    worst = low_end if maximize else high_end
    ys = np.where(np.isfinite(scores), scores, worst)
    ks = np.arange(1, len(ys) + 1)
    lower_cdf, point, upper_cdf = EmpiricalDistribution.confidence_bands(
        ys, CONFIDENCE, a=low_end, b=high_end, generator=np.random.default_rng(BAND_SEED), n_jobs=1
    )
    minimize = not maximize
    # A CDF band's upper edge is the stochastically smaller distribution: the lower curve, either way.
    return pd.DataFrame(
        {
            "k": ks,
            "median": point.quantile_tuning_curve(ks, minimize=minimize),
            "low": upper_cdf.quantile_tuning_curve(ks, minimize=minimize),
            "high": lower_cdf.quantile_tuning_curve(ks, minimize=minimize),
            "expected": point.average_tuning_curve(ks, minimize=minimize),
        }
    )


def curves(
    trials: pd.DataFrame, *, maximize: bool, support: tuple[float, float] = (-math.inf, math.inf)
) -> pd.DataFrame:
    """Every arm's curve (arm, k, median, low, high, expected), from a tuning record's rows."""
    parts = [
        arm_curve(group.sort_values("trial")["score"].to_numpy(dtype=float), maximize=maximize, support=support).assign(
            arm=arm
        )
        for arm, group in trials.groupby("arm", sort=False)
    ]
    return pd.concat(parts, ignore_index=True)[["arm", "k", "median", "low", "high", "expected"]]


def order(curve: pd.DataFrame, *, maximize: bool) -> dict[int, tuple[str, ...]]:
    """The arms, best first by their median curve, at every budget k they all reached."""
    common = curve.groupby("arm").k.max().min()
    ranked = {}
    for k, at in curve[curve.k <= common].groupby("k"):
        ranked[int(k)] = tuple(at.sort_values("median", ascending=not maximize, kind="stable").arm)
    return ranked


def verdict(curve: pd.DataFrame, *, maximize: bool) -> str:
    """Whether the arms' order is the same at every budget, and the budget it is judged at."""
    ranked = order(curve, maximize=maximize)
    final = max(ranked)
    if len(set(ranked.values())) == 1:
        return f"The arms' order ({' > '.join(ranked[final])}) is the same at every budget from 1 to {final} trials."
    changes = [k for k in ranked if k > 1 and ranked[k] != ranked[k - 1]]
    return (
        f"The arms' order changes with the budget (at k = {', '.join(map(str, changes))}); it is judged at the full "
        f"budget, k = {final}: {' > '.join(ranked[final])}."
    )


def _bound(value: float, decimals: int) -> str:
    return ("∞" if value > 0 else "-∞") if math.isinf(value) else tables.number(value, decimals)


def markdown(curve: pd.DataFrame, *, title: str, maximize: bool, decimals: int = 3) -> str:
    shown = curve.assign(
        **{
            "median [band]": [
                f"{_bound(r.median, decimals)} [{_bound(r.low, decimals)}, {_bound(r.high, decimals)}]"
                for r in curve.itertuples()
            ]
        }
    )
    wide = shown.pivot(index="k", columns="arm", values="median [band]").reset_index()
    lines = [
        f"## {title}",
        "",
        f"The median best validation score of k trials, with its simultaneous {100 * CONFIDENCE:g} % band "
        f"(opda, Lourie et al. 2024; {'higher' if maximize else 'lower'} is better). {verdict(curve, maximize=maximize)}",
        "",
        tables.markdown(wide, right=len(wide.columns) - 1),
    ]
    return "\n".join(lines) + "\n"


def figure(curve: pd.DataFrame, path: Path, *, title: str, ylabel: str, log_y: bool = False) -> None:
    """One panel: each arm's median curve, its band shaded; one colour per arm (tables.order)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    arms = [a for a in tables.ARM_ORDER if a in set(curve.arm)] + sorted(set(curve.arm) - set(tables.ARM_ORDER))
    for arm in arms:
        part = curve[curve.arm == arm]
        color = tables.arm_color(arm, arms)
        finite = part[np.isfinite(part.low) & np.isfinite(part.high)]
        ax.fill_between(finite.k, finite.low, finite.high, color=color, alpha=0.15, linewidth=0)
        ax.plot(part.k, part["median"], "-o", ms=3, color=color, label=f"{arm} (median; band {100 * CONFIDENCE:g} %)")
    ax.set_xlabel("trials of the arm's search (k)")
    ax.set_ylabel("\n".join(textwrap.wrap(ylabel, 40)), fontsize=9)
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best", frameon=False)
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _opda_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("opda")


def main(argv: list[str] | None = None) -> None:
    """`horst-tuning-curves`: the tuning curves of a tuning record, as a table and a figure.

        horst-tuning-curves results/tuning/vit/mnist1d/tuning.csv --maximize --support 0 1
        horst-tuning-curves results/tuning/gpt2/pydoc/tuning.csv --support 1 inf --log

    Writes tuning_curves.md (also printed), tuning_curves.csv and tuning_curves.png beside the
    record (or into --out)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="horst-tuning-curves",
        description=(main.__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(main.__doc__ or "").split("\n\n", 1)[1],
    )
    parser.add_argument("record", type=Path, help="a tuning record (tuning.csv)")
    parser.add_argument("--maximize", action="store_true", help="higher scores are better (default: lower)")
    parser.add_argument("--support", nargs=2, type=float, default=(-math.inf, math.inf), metavar=("LOW", "HIGH"),
                        help="the scores' possible range (top-1: 0 1; perplexity: 1 inf); a failed trial scores its worst end")  # fmt: skip
    parser.add_argument("--log", action="store_true", help="a log-scale score axis (perplexity)")
    parser.add_argument("--out", type=Path, help="the folder to write (default: the record's)")
    args = parser.parse_args(argv)
    if not args.record.is_file():
        sys.exit(f"error: no tuning record {args.record}: give a tuning.csv that horst-tune wrote")
    trials = pd.read_csv(args.record)
    out = args.out or args.record.parent
    out.mkdir(parents=True, exist_ok=True)
    curve = curves(trials, maximize=args.maximize, support=tuple(args.support))
    title = f"Tuning curves of {', '.join(trials.arm.unique())} ({args.record})"
    command = " ".join(["horst-tuning-curves", *(argv if argv is not None else sys.argv[1:])])
    text = f"Written by `{command}` from the record (opda {_opda_version()}).\n\n" + markdown(
        curve, title=title, maximize=args.maximize
    )
    (out / "tuning_curves.md").write_text(text)
    tables.write_csv(curve, out / "tuning_curves.csv")
    figure(curve, out / "tuning_curves.png", title=title, ylabel=str(trials.metric.iloc[0]), log_y=args.log)
    print(text)
