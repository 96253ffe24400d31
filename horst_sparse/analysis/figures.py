"""The figures, readable at a glance: every seed shown (arms side by side, each with its own
marker, so equal values do not hide each other), the mean as a line with its t-interval over the
seeds as bars, a weight histogram as the seeds' mean and range; sparsity on a log axis of
density (1 - sparsity), so 98, 99 and 99.5 % sit as far apart as 50, 75 and 87.5 %; titles say
what ran; no text on text (legends below the axes, constrained layout) and none past the canvas's
edges (`_fit_in_canvas`)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from horst_sparse.analysis.claims import pct
from horst_sparse.analysis.matched import STEP, curves
from horst_sparse.analysis.runs import weight_histogram
from horst_sparse.analysis.stats import paired_interval
from horst_sparse.analysis.tables import ARM_ORDER, SETTING_GROUP, arm_color, order, settings

MARKERS = "osD^vP*Xh"
DPI = 130  # the figures' resolution: also the one their text is fitted at (_fit_in_canvas)
LEGEND = dict(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)  # below the axes


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _rewrap(text: str, shorter: float) -> str:
    """`text` with each of its lines wrapped at `shorter` times its longest line's length."""
    lines = text.split("\n")
    width = max(8, int(max(map(len, lines)) * shorter))
    return "\n".join(textwrap.fill(line, width) for line in lines)


def _overflow(artist, fig) -> float:
    """0 where `artist` lies between the canvas's left and right edges as last drawn, else its width
    over the canvas's (above 1: no placement fits it)."""
    box = artist.get_window_extent(fig.canvas.get_renderer())
    return 0.0 if box.x0 >= 0 and box.x1 <= fig.bbox.width else box.width / fig.bbox.width


def _fit_in_canvas(fig, legend_columns: int) -> None:
    """Every title and legend inside the figure's canvas, as savefig will lay it out. Constrained
    layout moves and shrinks the axes to make room, but it cannot shrink a text wider than the
    figure itself (a suptitle, a panel's title, a legend row of long arm and setting names): that
    one would run off both edges. So after each layout such a title is wrapped narrower and such
    a legend gets fewer columns (one column: its labels wrapped), until nothing is outside."""
    columns = {ax: legend_columns for ax in fig.axes}
    for _ in range(50):  # each round narrows one step; a figure of any sane size fits long before
        fig.draw_without_rendering()
        changed = False
        for text in [fig._suptitle, *(ax.title for ax in fig.axes)]:
            if text is not None and text.get_text() and (over := _overflow(text, fig)):
                text.set_text(_rewrap(text.get_text(), min(0.9, 1 / over)))
                changed = True
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is None or not _overflow(legend, fig):
                continue
            handles, labels = ax.get_legend_handles_labels()
            if columns[ax] > 1:
                columns[ax] -= 1
            else:
                labels = [_rewrap(t.get_text(), 0.8) for t in legend.get_texts()]
            ax.legend(handles, labels, ncols=columns[ax], **LEGEND)
            changed = True
        if not changed:
            return


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


def _interval_words(counts: pd.Series, confidence: float) -> str:
    """What the bars are, with the seed count of the figure's cells (`counts`: seeds per cell)."""
    if counts.empty or counts.max() == 1:
        return "one seed per cell: its value, no interval"
    low, high = int(counts.min()), int(counts.max())
    seeds = f"{high}" if low == high else f"{low}-{high}"
    return f"points: seeds; lines: their mean; bars: its {100 * confidence:g}\u00a0% t-interval over {seeds} seeds"


def metric_figure(
    frame: pd.DataFrame,
    path: Path,
    *,
    metric: str,
    ylabel: str,
    title: str,
    log_y: bool = False,
    confidence: float = 0.95,
) -> None:
    """One panel per (data, model); per arm and setting (an arm swept over settings draws one line
    per setting, named by the keys that differ: tables.settings) its seeds as points, its mean as
    a line and the mean's t-interval over the seeds as bars (none for one seed). Runs that
    diverged are left out of the mean, as in the tables."""
    plt = _pyplot()
    rows = frame[frame.metric == metric]
    named = settings(rows).rename(columns={"setting_rank": "_setting"})
    rows = order(rows.merge(named, on=[*SETTING_GROUP, "signature"], how="left"))
    rows["line"] = [f"{a}, {s}" if s else a for a, s in zip(rows["arm"], rows["setting"].fillna(""))]
    panels = list(rows.groupby(["data", "model"], sort=False))
    fig, axes = plt.subplots(
        1, len(panels), figsize=(6 * len(panels), 4.4), dpi=DPI, squeeze=False, layout="constrained"
    )
    arms = list(dict.fromkeys(rows["arm"]))
    lines = list(dict.fromkeys(rows["line"]))
    for ax, ((data, model), panel) in zip(axes[0], panels):
        sparsities = sorted(panel["sparsity"].unique())
        bounds = []
        for i, (line, runs) in enumerate(panel.groupby("line", sort=False)):
            k = lines.index(line)  # a marker per line: an arm's settings share its colour
            color = arm_color(runs["arm"].iloc[0], arms)
            offset = 1.06 ** (i - (panel["line"].nunique() - 1) / 2)  # side by side on the log axis
            density = (1 - runs["sparsity"]) * offset
            ax.scatter(
                density,
                runs["value"],
                marker=MARKERS[k % len(MARKERS)],
                s=16,
                alpha=0.55,
                color=color,
                linewidths=0,
            )
            cells = [
                (s, paired_interval(v[np.isfinite(v)].to_numpy(), confidence))
                for s, v in runs.groupby("sparsity")["value"]
            ]
            x = np.array([1 - s for s, _ in cells]) * offset
            means, low, high = (np.array([getattr(c, f) for _, c in cells]) for f in ("mean", "low", "high"))
            bounds += [*low, *high]
            seeds = runs["seed"].nunique()
            measured = runs.loc[np.isfinite(runs["value"]), "seed"].nunique()
            lost = f", {seeds - measured} diverged" if measured < seeds else ""  # not in the mean: say so
            style = dict(
                marker=MARKERS[k % len(MARKERS)],
                ms=5,
                color=color,
                label=f"{line} (1 seed{lost})" if measured == 1 else f"{line} (mean of {measured} seeds{lost})",
            )
            if np.isfinite(low).any():
                ax.errorbar(x, means, yerr=[means - low, high - means], capsize=3, elinewidth=1, **style)
            else:  # one seed per cell: no interval to draw
                ax.plot(x, means, "-", **style)
        _density_axis(ax, sparsities)
        if log_y:
            reach = pd.Series(bounds, dtype=float)
            _plain_log_axis(ax, pd.concat([panel["value"], reach[reach > 0]]))  # the bars inside the axis
        ax.set_ylabel(ylabel)
        ax.set_title(f"{model} on {data}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(ncols=2, **LEGEND)
    counts = rows[np.isfinite(rows["value"])].groupby(["data", "model", "line", "sparsity"])["seed"].nunique()
    shown = [f"arms: {', '.join(arms)}", _interval_words(counts, confidence)]
    fig.suptitle("\n".join(textwrap.fill(line, 80 * len(panels)) for line in [title, *shown]), fontsize=10)
    _fit_in_canvas(fig, legend_columns=2)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _density_on(grid: np.ndarray, counts: list[float], edges: list[float]) -> np.ndarray:
    """A histogram's density on other edges: every seed's histogram spans its own range (its
    weights' smallest to largest), so seeds are averaged on one grid; a bin's mass spread evenly."""
    counts = np.asarray(counts, dtype=float)
    cumulative = np.concatenate([[0.0], np.cumsum(counts)]) / counts.sum()
    return np.diff(np.interp(grid, np.asarray(edges, dtype=float), cumulative)) / np.diff(grid)


def _seed_words(arms: list[list[tuple[Any, tuple]]]) -> str:
    """What the lines and bands are (`arms`: each arm's drawn runs): `seed 0 only` where each arm
    has one, else `10 seeds: mean and range (...)`."""
    counts = {len(runs) for runs in arms}
    if counts == {1}:
        seeds = sorted({row.seed for runs in arms for row, _ in runs})
        return f"seed {', '.join(f'{s:g}' for s in seeds)} only"
    seeds = f"{counts.pop()} seeds" if len(counts) == 1 else "each arm's seeds (legend: how many)"
    return f"{seeds}: mean and range (line: the seeds' mean density; band: their min to max per bin)"


def weight_figure(
    frame: pd.DataFrame, folders: dict[str, Path], path: Path, saved: dict[str, dict] | None = None, caveat: str = ""
) -> tuple[list[str], dict[str, dict]]:
    """log10|w| densities of the prunable weights, per arm, one panel per pipeline: every seed's run
    (ViT: at the arm's highest sparsity) as the mean density over the seeds and its min-max band;
    each histogram from its run folder, else from `saved` (run -> signature, from, counts, edges:
    what an earlier figure drew; a study resumed from its record has no folders). Returns notes and
    the histograms drawn, in `saved`'s form."""
    saved = saved or {}
    runs = frame.sort_values(["sparsity", "seed"], ascending=[False, True], kind="stable").drop_duplicates("run")
    chosen = order(runs[runs["sparsity"] == runs.groupby(["pipeline", "arm"])["sparsity"].transform("max")])
    # The seeds of one setting per arm (a sweep's table holds several): its first, as the tables order them
    chosen = chosen[chosen["signature"] == chosen.groupby(["pipeline", "arm"])["signature"].transform("first")]
    drawn: dict[str, dict[str, list[tuple[Any, tuple]]]] = {}
    missing: dict[tuple[str, str], list[Any]] = {}
    used: dict[str, dict] = {}
    for row in chosen.itertuples():
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
            missing.setdefault((row.pipeline, row.arm), []).append(row)
            continue
        drawn.setdefault(row.pipeline, {}).setdefault(row.arm, []).append((row, histogram))
    notes = [
        f"{pipeline} {arm}: no weight histogram (weight_histogram.json or metrics.jsonl) for seed "
        f"{', '.join(f'{r.seed:g}' for r in rows)} ({rows[0].run}{', ...' if len(rows) > 1 else ''}); "
        "not in the weight figure"
        for (pipeline, arm), rows in missing.items()
    ]
    if not drawn:
        return notes + ["weight figure not drawn: no run folder with a weight histogram"], used
    all_arms = list(dict.fromkeys(a for items in drawn.values() for a in items))
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(drawn), figsize=(6 * len(drawn), 4.4), dpi=DPI, squeeze=False, layout="constrained")
    for ax, (pipeline, items) in zip(axes[0], drawn.items()):
        histograms = [h for runs in items.values() for _, h in runs]
        bins = max(len(counts) for counts, _, _ in histograms)
        grid = np.linspace(min(e[0] for _, e, _ in histograms), max(e[-1] for _, e, _ in histograms), bins + 1)
        for arm, runs in items.items():
            densities = np.array([_density_on(grid, counts, edges) for _, (counts, edges, _) in runs])
            color = arm_color(arm, all_arms)
            if len(runs) > 1:
                ax.stairs(densities.max(0), grid, baseline=densities.min(0), fill=True, alpha=0.2, color=color)
            seeds = f"{len(runs)} seeds" if len(runs) > 1 else f"seed {runs[0][0].seed:g}"
            ax.stairs(densities.mean(0), grid, label=f"{arm} ({seeds})", linewidth=1.5, color=color)
            wheres = "; ".join(dict.fromkeys(where for _, (_, _, where) in runs))
            notes.append(
                f"{pipeline} {arm}: {runs[0][0].run}{' and the other seeds' if len(runs) > 1 else ''} ({wheres})"
            )
        row = next(iter(items.values()))[0][0]
        # AC/DC runs: the last dense (decompressed) epoch's weights; one-shot pruning: the trained model's
        when = f"AC/DC at {pct(row.sparsity)}, last dense epoch" if row.method == "acdc" else "after training"
        ax.set_title(f"{row.model} on {row.data}\n{when}", fontsize=9)
        ax.set_xlabel("log10 |w| of the prunable weights")
        ax.set_ylabel("density")
        ax.grid(alpha=0.3)
        ax.legend(ncols=3, **LEGEND)
    seeds = _seed_words([runs for items in drawn.values() for runs in items.values()])
    title = [f"Weight magnitudes of {', '.join(all_arms)}{caveat}", seeds]
    fig.suptitle("\n".join(textwrap.fill(line, 80 * len(drawn)) for line in title), fontsize=10)
    _fit_in_canvas(fig, legend_columns=3)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return notes, used


def _plain_log_x(ax, values: pd.Series) -> None:
    """The x axis on a log scale with plain numbers, as `_plain_log_axis` the y axis."""
    from matplotlib.ticker import LogLocator, NullLocator

    finite = values[np.isfinite(values)]
    ax.set_xscale("log")
    ax.set_xlim(finite.min() / 1.05, finite.max() * 1.05)
    ax.xaxis.set_major_locator(LogLocator(subs=(1, 1.5, 2, 3, 5, 7)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:g}")


def matched_figure(
    frame: pd.DataFrame,
    path: Path,
    *,
    pipeline: str,
    reference: str,
    arms: list[str],
    sparsities: list[float],
    cells: dict[str, Any],
    title: str,
) -> None:
    """What the endpoints at matched dense perplexity read (horst_sparse.analysis.matched): a panel
    per sparsity of the pruned against the dense perplexity, both on log axes, over training: the
    `reference` arm's curve of every seed (the endpoint interpolates on it), its final model ringed;
    each other arm's final models as points, with its curve as the geometric mean over its seeds at
    each measured step; the diagonal: pruning lost nothing."""
    plt = _pyplot()
    data = curves(frame, pipeline, metric=cells["metric"], method=cells["method"], pattern=cells["pattern"])
    data = data[data.arm.isin(arms) & np.isfinite(data.dense) & np.isfinite(data.pruned)]
    arms = sorted(arms, key=lambda a: (ARM_ORDER.index(a) if a in ARM_ORDER else len(ARM_ORDER), arms.index(a)))
    fig, axes = plt.subplots(
        1, len(sparsities), figsize=(6 * len(sparsities), 4.8), dpi=DPI, squeeze=False, layout="constrained"
    )
    for ax, sparsity in zip(axes[0], sparsities):
        panel = data[np.isclose(data.sparsity, sparsity)]
        for k, arm in enumerate(arms):
            mine, color = panel[panel.arm == arm], arm_color(arm, arms)
            if mine.empty:  # an arm the record has no curve of yet
                continue
            final = mine[mine[STEP].isna()]
            seeds = mine.seed.nunique()
            if arm == reference:
                for i, (_, run) in enumerate(mine.groupby("seed")):
                    label = f"{arm}: each seed's curve ({seeds} seed{'s' * (seeds > 1)})" if i == 0 else None
                    ax.plot(run.dense, run.pruned, "-", marker=".", ms=3, lw=0.8, alpha=0.5, color=color, label=label)
                ax.scatter(final.dense, final.pruned, s=30, facecolors="none", edgecolors=color, linewidths=1)
                continue
            logs = mine.assign(dense=np.log(mine.dense), pruned=np.log(mine.pruned), _final=mine[STEP].isna())
            mean = np.exp(logs.groupby(["_final", STEP], dropna=False)[["dense", "pruned"]].mean())
            marker = MARKERS[k % len(MARKERS)]
            label = f"{arm}: mean curve of {seeds} seeds"
            ax.plot(mean.dense, mean.pruned, "-", marker=marker, ms=3, lw=1.5, color=color, label=label)
            ax.scatter(final.dense, final.pruned, s=18, marker=marker, alpha=0.7, color=color, linewidths=0)
        ax.scatter([], [], s=30, facecolors="none", edgecolors="grey", label="final models (other arms: filled)")
        _plain_log_x(ax, panel.dense)
        _plain_log_axis(ax, panel.pruned)
        low, high = min(ax.get_xlim()[0], ax.get_ylim()[0]), max(ax.get_xlim()[1], ax.get_ylim()[1])
        ax.plot([low, high], [low, high], ":", color="black", lw=0.8, scalex=False, scaley=False, label="no loss")
        ax.set_xlabel("dense perplexity (log scale; training goes right to left)")
        ax.set_ylabel(f"perplexity after {cells['method']} pruning to {pct(sparsity)} (log)")
        ax.set_title(f"{pct(sparsity)} sparsity", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(ncols=2, **LEGEND)  # one legend: every panel draws the same arms and marks
    words = (
        f"{reference}: every seed's curve, the matched endpoint's reference; other arms: their seeds' final "
        "models and their mean curve"
    )
    fig.suptitle("\n".join(textwrap.fill(line, 80 * len(sparsities)) for line in [title, words]), fontsize=10)
    _fit_in_canvas(fig, legend_columns=2)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
