"""The figures as a reader sees them: no title, axis label, tick label or legend past the canvas's
edges. Checked three ways: on the figures the study's own command draws from the committed
records (their text boxes as savefig laid them out), on the committed PNGs themselves (a blank
border: cut text leaves ink on the edge) and on a figure of names too long for one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import record
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


def _tick_labels(axis) -> list:
    """The tick labels drawn: those at a tick inside the axis's view (matplotlib keeps others, unshown)."""
    low, high = sorted(axis.get_view_interval())
    return [label for tick, label in zip(axis.get_ticklocs(), axis.get_ticklabels()) if low <= tick <= high]


def _texts(fig) -> list[tuple[str, object]]:
    named = [("suptitle", fig._suptitle)]
    for i, ax in enumerate(fig.axes):
        named += [
            (f"panel {i} title", ax.title),
            (f"panel {i} x label", ax.xaxis.label),
            (f"panel {i} y label", ax.yaxis.label),
            (f"panel {i} legend", ax.get_legend()),
            *((f"panel {i} tick {t.get_text()!r}", t) for t in [*_tick_labels(ax.xaxis), *_tick_labels(ax.yaxis)]),
        ]
    return [(name, artist) for name, artist in named if artist is not None and artist.get_visible()]


@pytest.fixture
def drawn(monkeypatch) -> dict[str, list[str]]:
    """Every figure saved while the test runs: its file's name -> the texts outside its canvas
    (name and box in pixels), measured on the layout savefig drew (the layout engine frozen after
    it, so measuring moves nothing)."""
    from matplotlib.figure import Figure

    save = Figure.savefig
    found: dict[str, list[str]] = {}

    def savefig(self, path, *args, **kwargs):
        save(self, path, *args, **kwargs)
        self.set_layout_engine("none")
        self.draw_without_rendering()
        renderer = self.canvas.get_renderer()
        width, height = self.bbox.width, self.bbox.height
        outside = []
        for name, artist in _texts(self):
            box = artist.get_window_extent(renderer)
            if box.x0 < 0 or box.y0 < 0 or box.x1 > width or box.y1 > height:
                outside.append(f"{name}: x {box.x0:.0f}..{box.x1:.0f} of {width:.0f}, y {box.y0:.0f}..{box.y1:.0f}")
        found[str(path)] = outside

    monkeypatch.setattr(Figure, "savefig", savefig)
    return found


@pytest.mark.slow  # ~40 s: every version's report redrawn (the committed figures' borders: below, by default)
def test_the_studys_figures_lie_inside_their_canvas_and_are_the_committed_ones(tmp_path, drawn):
    """`horst-sparse study --report-only` (and the demo's, `--demo --out results/demo --report-only`) on
    copies of the committed results: every figure it draws keeps its text inside, and is the
    committed PNG byte for byte, so the committed ones are this code's (after a change to the
    figures: regenerate them with those two commands on a clean tree)."""
    from horst_sparse.study.run import run_study

    for study in ("embedded", "demo"):
        copy = tmp_path / study
        shutil.copytree(RESULTS / study, copy)  # the record and the histograms the weight figures were drawn from
        run_study(study, report_only=True, out=copy)  # its status: whether the current version's runs are all done
    assert len(drawn) == len(list(RESULTS.glob("demo/*.png"))) + len(list(RESULTS.glob("embedded/v*/*.png")))
    assert {Path(path).relative_to(tmp_path).as_posix(): cut for path, cut in drawn.items() if cut} == {}
    differ = [
        Path(path).relative_to(tmp_path).as_posix()
        for path in drawn
        if Path(path).read_bytes() != (RESULTS / Path(path).relative_to(tmp_path)).read_bytes()
    ]
    assert differ == [], "committed figures not drawn by this code (regenerate them)"


@pytest.mark.parametrize("png", sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*.png")))
def test_a_committed_figure_has_a_blank_border(png):
    """Text run off the canvas is cut at its edge, and leaves ink there: the outer 2 pixels of
    every committed figure are background."""
    pixels = np.asarray(Image.open(RESULTS / png).convert("RGB")).astype(int)
    background = pixels[0, 0]
    border = np.concatenate([pixels[:2].reshape(-1, 3), pixels[-2:].reshape(-1, 3)])
    border = np.concatenate([border, pixels[:, :2].reshape(-1, 3), pixels[:, -2:].reshape(-1, 3)])
    assert (np.abs(border - background).max(1) <= 8).all()


def test_names_too_long_for_one_line_are_wrapped_inside_the_canvas(tmp_path, drawn):
    """Long arm, model and data names and a title of one long word: wider than the figure itself
    in one line, which no placement fits; they are wrapped and the legend narrowed, inside."""
    from horst_sparse.analysis import figures

    arms = ["adamw", "horst_mirror_off_with_a_long_control_name", "horst_prunable_beta0_weight_decay_sweep", "ham"]
    frame = record({(a, "top1", s): [80.0 + i, 81.0 + i, 79.5 + i] for i, a in enumerate(arms) for s in (0.7, 0.9)})
    frame["model"] = "vit_mnist1d_with_a_long_model_name_and_its_recipe_and_its_settings"
    frame["data"] = "mnist1d_long_dataset_name"
    path = tmp_path / "long.png"
    figures.metric_figure(frame, path, metric="top1", ylabel="top-1 (%)", title="Top-1 " + "x" * 150)
    assert drawn == {str(path): []}
