"""A pick that holds: under a stability guard, a trial whose seed failed, or that lies within the
stated radius of a failed trial in the search space's unit cube, is neither rerun nor picked; where
no candidate is left the pick is refused, naming why. Without a guard the rule is the plain one."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from horst_sparse import tune as tuning
from horst_sparse.analysis.tuning_curves import NoStablePick, Stability, pick, stable_top
from horst_sparse.pipeline import get as get_pipeline

SPACE = {"train.lr": (1e-4, 1e-2, True), "train.warmup_steps": (0, 100, False)}


def trials(points: list[tuple[float, int, float]], reruns: dict[int, list[float]] | None = None) -> pd.DataFrame:
    """(lr, warm-up, validation perplexity) per trial at the search seed; `reruns`: more seeds' scores."""
    rows = [
        {"arm": "horst", "trial": i, "seed": 100, "stage": "search", "score": score, "train.lr": lr, "train.warmup_steps": w}
        for i, (lr, w, score) in enumerate(points)
    ]  # fmt: skip
    for trial, scores in (reruns or {}).items():
        lr, w, _ = points[trial]
        rows += [
            {"arm": "horst", "trial": trial, "seed": 101 + j, "stage": "rerun", "score": s, "train.lr": lr, "train.warmup_steps": w}
            for j, s in enumerate(scores)
        ]  # fmt: skip
    return pd.DataFrame(rows)


def test_the_unit_cube_puts_a_log_key_on_its_log_scale():
    unit = Stability(SPACE, 0.1).unit(trials([(1e-3, 25, 1.0), (1e-4, 100, 1.0)]))
    assert unit.tolist() == [[pytest.approx(0.5), 0.25], [0.0, 1.0]]


def test_a_trial_next_to_a_failed_one_is_not_rerun_and_not_picked():
    # trial 0 is best on the search seed, but trial 1 (0.05 away in lr, 0.02 in warm-up) diverged
    rows = trials([(1e-3, 50, 40.0), (1.12e-3, 52, math.inf), (1e-4, 0, 45.0), (1e-2, 100, 60.0)])
    guard = Stability(SPACE, 0.1)
    assert guard.unstable(rows) == {1: "trial 1 failed at seed 100", 0: "trial 1, 0.025 from it (radius 0.1), failed"}
    assert stable_top(rows, maximize=False, top_k=2, stability=guard) == [2, 3]
    assert pick(rows, maximize=False, top_k=2) == 0  # the plain rule takes the cliff's edge
    assert pick(rows, maximize=False, top_k=2, stability=guard) == 2
    assert pick(rows, maximize=False, top_k=2, stability=Stability(SPACE, 0.01)) == 0  # farther than the radius


def test_a_candidate_whose_rerun_seed_failed_is_out_and_none_left_is_refused():
    rows = trials([(1e-3, 50, 40.0), (1e-4, 0, 45.0), (1e-2, 100, 60.0)], reruns={0: [41.0, math.inf], 1: [44.0, 46.0]})
    guard = Stability(SPACE, 0.1)
    assert pick(rows, maximize=False, top_k=2, stability=guard) == 1
    both = trials([(1e-3, 50, 40.0), (1e-4, 0, 45.0), (1e-2, 100, 60.0)], reruns={0: [math.inf], 1: [math.nan]})
    with pytest.raises(NoStablePick, match=r"no stable trial among the top 2 of horst: trial 0: trial 0 failed at seed 101; trial 1: trial 1 failed at seed 101"):  # fmt: skip
        pick(both, maximize=False, top_k=2, stability=guard)


def test_a_record_without_a_key_of_the_space_is_named():
    with pytest.raises(ValueError, match="the tuning record has no column optimizer.alpha"):
        Stability({"optimizer.alpha": (1e-2, 1e2, True)}, 0.1).unit(trials([(1e-3, 5, 1.0)]))


def test_the_second_stage_box_goes_past_a_log_edge_and_stops_at_a_linear_one():
    """`horst-sparse tune --refine-trials N --stability-radius R`: fresh points in the box of
    half-width R around the search's best, a log key's box beyond its range where the best sits
    at its edge (a widened range that samples new values), a warm-up's inside [0, its end]."""
    space = {
        "train.lr": "tag(log, interval(1e-4, 1e-2))",
        "train.warmup_steps": "int(interval(0, 100))",
        "optimizer.name": "choice(adamw, horst)",
    }
    box = tuning.refine_space(space, {"train.lr": 1e-2, "train.warmup_steps": 10, "optimizer.name": "horst"}, 0.25)
    assert box == {
        "train.lr": "tag(log, interval(0.00316228, 0.0316228))",  # half a decade either side of 1e-2
        "train.warmup_steps": "int(interval(0, 35))",
        "optimizer.name": "choice(horst)",
    }
    joined = tuning.union(space, box)
    assert joined["train.lr"] == "tag(log, interval(0.0001, 0.0316228))" and joined["train.warmup_steps"] == (
        "int(interval(0, 100))"
    )
    # the edges are judged on the union: the best's lr is inside it now, 0.8 of its log range
    assert tuning.edges(joined, {"train.lr": 1e-2, "train.warmup_steps": 50, "optimizer.name": "horst"}) == []


def test_a_pick_with_no_stable_candidate_is_the_plain_pick_flagged():
    """Where every candidate is unstable the tuning still ends in a pick, the unguarded one, with the
    reasons in its provenance (`flag`): an arm with no stable point in its budget is a result."""
    rows = trials([(1e-3, 50, 40.0), (1.12e-3, 52, math.inf)], reruns={0: [41.0, math.inf]}).to_dict("records")
    metric = get_pipeline("gpt2").tuning
    chosen = tuning.pick(rows, metric, top_k=2, stability=Stability(SPACE, 0.1))
    assert chosen["trial"] == 0 and "trial 1: trial 1 failed at seed 100" in chosen["flag"]
    assert tuning.pick(rows, metric, top_k=2)["flag"] is None
