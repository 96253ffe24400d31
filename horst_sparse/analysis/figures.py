"""The figures, readable at a glance: every seed shown (arms side by side, each with its own
marker, so equal values do not hide each other), the mean as a line; sparsity on a log axis of
density (1 - sparsity), so 98, 99 and 99.5 % sit as far apart as 50, 75 and 87.5 %; titles say
what ran; no text on text (legends below the axes, constrained layout)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from horst_sparse.analysis.claims import pct
from horst_sparse.analysis.runs import weight_histogram
from horst_sparse.analysis.tables import arm_color, order

MARKERS = "osD^vP*Xh"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _density_axis(ax, sparsities: list[float]) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    densities = [1 - s for s in sparsities]
    ax.set_xlim(max(densities) * 1.25, min(densities) / 1.25)  # reversed: sparsity grows to the right
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(densities))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(lambda d, _: pct(round(1 - d, 6)))
    ax.set_xlabel("sparsity (log scale of the density 1 − s)")


def _plain_log_axis(ax, values: pd.Series) -> None:
    """A log y axis labelled with plain numbers (30, 40, 60, ...), not 10^2 alone."""
    from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator

    finite = values[np.isfinite(values)]
    low, high = finite.min() / 1.05, finite.max() * 1.05
    ax.set_yscale("log")
    for steps in ((1, 2, 5), (1, 1.5, 2, 3, 4, 5, 6, 7, 8)):
        ticks = [
            m * 10**e for e in range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1) for m in steps
        ]
        inside = [t for t in ticks if low <= t <= high]
        if len(inside) >= 4:
            break
    # a range narrower than 1-8 steps (tiny runs, one optimizer): evenly spaced round numbers
    ax.yaxis.set_major_locator(FixedLocator(inside) if len(inside) >= 3 else MaxNLocator(5))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")
    ax.set_ylim(low, high)


def metric_figure(
    frame: pd.DataFrame, path: Path, *, metric: str, ylabel: str, title: str, log_y: bool = False
) -> None:
    """One panel per (data, model); per arm its seeds as points and its mean as a line."""
    plt = _pyplot()
    rows = order(frame[frame.metric == metric])
    panels = list(rows.groupby(["data", "model"], sort=False))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.4), squeeze=False, layout="constrained")
    arms = list(dict.fromkeys(rows["arm"]))
    for ax, ((data, model), panel) in zip(axes[0], panels):
        sparsities = sorted(panel["sparsity"].unique())
        for i, (arm, runs) in enumerate(panel.groupby("arm", sort=False)):
            k = arms.index(arm)
            offset = 1.06 ** (i - (panel["arm"].nunique() - 1) / 2)  # side by side on the log axis
            density = (1 - runs["sparsity"]) * offset
            ax.scatter(
                density,
                runs["value"],
                marker=MARKERS[k % len(MARKERS)],
                s=16,
                alpha=0.55,
                color=arm_color(arm, arms),
                linewidths=0,
            )
            means = runs.groupby("sparsity")["value"].mean()
            seeds = runs["seed"].nunique()
            ax.plot(
                (1 - means.index) * offset,
                means.to_numpy(),
                "-",
                marker=MARKERS[k % len(MARKERS)],
                ms=5,
                color=arm_color(arm, arms),
                label=f"{arm} (mean of {seeds} seed{'s' if seeds > 1 else ''})",
            )
        _density_axis(ax, sparsities)
        if log_y:
            _plain_log_axis(ax, panel["value"])
        ax.set_ylabel(ylabel)
        ax.set_title(f"{model} on {data}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2, frameon=False)
    arms_text = textwrap.fill(f"arms: {', '.join(arms)}; points: seeds, lines: their mean", 70 * len(panels))
    fig.suptitle(f"{title}\n{arms_text}", fontsize=10)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def weight_figure(
    frame: pd.DataFrame, folders: dict[str, Path], path: Path, saved: dict[str, dict] | None = None, caveat: str = ""
) -> tuple[list[str], dict[str, dict]]:
    """log10|w| densities of the prunable weights, per arm, one panel per pipeline: the first
    seed's run (ViT: at the highest sparsity), its histogram from its run folder, else from
    `saved` (run -> signature, from, counts, edges: what an earlier figure drew; a study resumed
    from its record has no folders). Returns notes and the histograms drawn, in `saved`'s form."""
    saved = saved or {}
    runs = order(frame.drop_duplicates("run")).sort_values(["sparsity", "seed"], ascending=[False, True], kind="stable")
    chosen = runs.groupby(["pipeline", "arm"], sort=False).head(1)
    drawn: dict[str, list[tuple[str, pd.Series, tuple]]] = {}
    used: dict[str, dict] = {}
    notes = []
    for row in order(chosen).itertuples():
        histogram = weight_histogram(folders[row.run]) if row.run in folders else None
        if histogram is not None:
            used[row.run] = {
                "signature": row.signature,
                "from": histogram[2],
                "counts": list(histogram[0]),
                "edges": list(histogram[1]),
            }
        elif saved.get(row.run, {}).get("signature") == row.signature:  # the run the record holds, not an older one
            used[row.run] = saved[row.run]
            histogram = (used[row.run]["counts"], used[row.run]["edges"], f"{used[row.run]['from']}, as drawn before")
        else:
            notes.append(
                f"{row.run}: no weight histogram (weight_histogram.json or metrics.jsonl); not in the weight figure"
            )
            continue
        drawn.setdefault(row.pipeline, []).append((row.arm, row, histogram))
    if not drawn:
        return notes + ["weight figure not drawn: no run folder with a weight histogram"], used
    all_arms = list(dict.fromkeys(a for items in drawn.values() for a, _, _ in items))
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(drawn), figsize=(6 * len(drawn), 4.4), squeeze=False, layout="constrained")
    for ax, (pipeline, items) in zip(axes[0], drawn.items()):
        for arm, row, (counts, edges, where) in items:
            counts, edges = np.asarray(counts, dtype=float), np.asarray(edges, dtype=float)
            density = counts / (counts.sum() * np.diff(edges))
            ax.stairs(density, edges, label=arm, linewidth=1.5, color=arm_color(arm, all_arms))
            notes.append(f"{pipeline} {arm}: {row.run} ({where})")
        row = items[0][1]
        # AC/DC runs: the last dense (decompressed) epoch's weights; one-shot pruning: the trained model's
        when = f"AC/DC at {pct(row.sparsity)}, last dense epoch" if row.method == "acdc" else "after training"
        ax.set_title(f"{row.model} on {row.data}\n{when}", fontsize=9)
        ax.set_xlabel("log10 |w| of the prunable weights")
        ax.set_ylabel("density")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=3, frameon=False)
    arms = list(dict.fromkeys(a for items in drawn.values() for a, _, _ in items))
    seeds = sorted({row.seed for items in drawn.values() for _, row, _ in items})
    title = f"Weight magnitudes of {', '.join(arms)} (seed {', '.join(f'{s:g}' for s in seeds)} only){caveat}"
    fig.suptitle(textwrap.fill(title, 70 * len(drawn)), fontsize=10)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return notes, used
