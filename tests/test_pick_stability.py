"""The pick rule of a tuning record with reruns (horst_sparse.analysis.tuning_curves.pick) and how
often a bootstrap over trials and seeds changes it (pick_stability): a clear winner is lost only
by the draws that miss it, two trials tied in mean trade the pick half the time, and the same seed
gives the same table."""

from __future__ import annotations

import math
import subprocess

import numpy as np
import pandas as pd
import pytest
import yaml

from horst_sparse.analysis.tuning_curves import by_protocol, guarded, pick, pick_stability, rerun_trials


def record(arm: str, seeds: dict[int, list[float]]) -> pd.DataFrame:
    """One arm's rows: each trial's first score its search at seed 100, the others its reruns."""
    rows = [
        {"arm": arm, "trial": trial, "seed": 100 + i, "stage": "search" if i == 0 else "rerun", "score": score}
        for trial, scores in seeds.items()
        for i, score in enumerate(scores)
    ]
    return pd.DataFrame(rows)


def test_an_old_record_picks_the_best_search_score_the_earlier_on_a_tie_and_a_failure_is_the_worst():
    old = record("adamw", {0: [0.5], 1: [0.7], 2: [0.7], 3: [math.nan]}).drop(columns="stage")
    assert pick(old, maximize=True, top_k=0) == 1 and pick(old, maximize=True, top_k=3) == 1
    perplexity = record("adamw", {0: [math.inf], 1: [60.0], 2: [55.0], 3: [-math.inf]})
    assert pick(perplexity, maximize=False, top_k=0) == 2  # -inf is a failure here too, not the best perplexity


def test_the_pick_is_the_best_mean_among_the_top_k_by_search_score():
    """Trial 0 leads the search by luck, trial 1 holds up over its seeds; trial 2's single score
    beats trial 0's mean but is outside the top 2, so never a candidate."""
    rows = record("horst", {0: [0.90, 0.60, 0.60], 1: [0.85, 0.84, 0.86], 2: [0.80], 3: [0.10]})
    assert pick(rows, maximize=True, top_k=2) == 1
    assert pick(rows, maximize=True, top_k=0) == 0  # without reruns: the best search score
    tied = record("horst", {0: [0.8, 0.9], 1: [0.9, 0.8], 2: [0.1]})
    assert pick(tied, maximize=True, top_k=2) == 0  # the earlier trial on a tie in mean
    failed_rerun = record("horst", {0: [0.8, 0.7], 1: [0.9, math.nan], 2: [0.1]})
    assert pick(failed_rerun, maximize=True, top_k=2) == 0
    mirrored = rows.assign(score=-rows.score)
    assert pick(mirrored, maximize=False, top_k=2) == 1


def test_the_rule_reads_one_arm_with_one_search_row_per_trial():
    with pytest.raises(ValueError, match="one arm"):
        pick(pd.concat([record("a", {0: [0.5]}), record("b", {0: [0.6]})]), maximize=True, top_k=0)
    with pytest.raises(ValueError, match="one search row"):
        pick(record("a", {0: [0.5]}).assign(stage="rerun"), maximize=True, top_k=1)


def test_a_clear_winner_changes_only_in_the_draws_that_miss_it():
    n, draws = 16, 2000
    rng = np.random.default_rng(1)
    scores = {t: [float(s)] for t, s in enumerate(rng.uniform(0.3, 0.6, n))}
    scores[5] = [0.95, 0.96, 0.94]
    for t in sorted(scores, key=lambda t: -scores[t][0])[1:3]:
        scores[t] += [scores[t][0] - 0.01, scores[t][0] + 0.01]
    table = pick_stability(record("adamw", scores), maximize=True, top_k=3, draws=draws)
    row = table.iloc[0]
    expected = (1 - 1 / n) ** n  # a draw of n trials with replacement holds no copy of a given one
    assert (row.trials, row.top_k, row.seeds, row.pick, row.draws) == (16, 3, 3, 5, draws)
    assert row.pick_score == pytest.approx(0.95)
    assert row.changed == row.absent  # every draw that holds the winner picks it
    assert abs(row.changed - expected) < 4 * math.sqrt(expected * (1 - expected) / draws)


def test_two_trials_tied_in_mean_trade_the_pick_half_the_time():
    """The same seed scores in another order: the same mean, the same bootstrap distribution.
    Fractions of 1024 keep every mean exact, so the actual tie goes to the earlier trial, and
    spread over the grid they make a tie of resampled means (trial 0's) rare."""
    seeds = [v / 1024 for v in (527, 781, 604, 899, 565, 702, 833, 951)]
    rows = record("ham", {0: seeds, 1: seeds[::-1]})
    draws = 4000
    row = pick_stability(rows, maximize=True, top_k=2, draws=draws).iloc[0]
    assert row.pick == 0 and row.runner_up == 1 and row.runner_up_share == row.changed
    # a quarter of the draws hold only trial 1; of the half that hold both, trial 1 wins half
    assert abs(row.changed - 0.5) < 4 * math.sqrt(0.25 / draws)


def test_a_fixed_seed_gives_the_same_table_and_an_arm_does_not_depend_on_the_others():
    rng = np.random.default_rng(2)
    rows = pd.concat(
        [
            record(arm, {t: list(rng.uniform(0.4, 0.8, 3 if t < 2 else 1)) for t in range(8)})
            for arm in ("horst", "adamw")
        ]
    )
    first = pick_stability(rows, maximize=True, top_k=2, draws=500, seed=7)
    pd.testing.assert_frame_equal(first, pick_stability(rows, maximize=True, top_k=2, draws=500, seed=7))
    assert first.arm.tolist() == ["adamw", "horst"]  # tables.ARM_ORDER, not the record's order
    alone = pick_stability(rows[rows.arm == "horst"], maximize=True, top_k=2, draws=500, seed=7)
    pd.testing.assert_frame_equal(alone, first[first.arm == "horst"].reset_index(drop=True))
    mirrored = pick_stability(rows.assign(score=-rows.score), maximize=False, top_k=2, draws=500, seed=7)
    pd.testing.assert_series_equal(mirrored.changed, first.changed)


def test_a_record_splits_by_protocol_and_counts_its_reruns():
    old = record("adamw", {0: [0.5], 1: [0.6]}).drop(columns="stage")
    new = record("adamw", {0: [0.5, 0.4], 1: [0.6, 0.7], 2: [0.1]}).assign(protocol=3)
    parts = by_protocol(pd.concat([old, new], ignore_index=True))
    assert [(v, len(p)) for v, p in parts] == [(None, 2), (3, 5)]
    assert rerun_trials(parts[1][1]) == 2 and rerun_trials(old) == 0
    assert pick(parts[0][1], maximize=True, top_k=0) == 1  # no stage in a mixed record: a search trial
    assert [v for v, _ in by_protocol(old)] == [None]


def test_the_trials_the_guard_held_out_are_never_picked_in_the_pick_or_any_draw():
    """v7's stability guard keeps a trial next to a failed one from the pick and never reruns it: its
    one lucky search score would win an unguarded reading, and wins neither the pick nor a draw here."""
    rows = record("horst_prunable", {0: [0.90], 1: [0.85, 0.84, 0.86], 2: [0.80, 0.81, 0.79], 3: [math.nan]})
    assert pick_stability(rows, maximize=True, top_k=2, draws=200).pick.iloc[0] == 0
    row = pick_stability(rows, maximize=True, top_k=2, draws=200, held_out={"horst_prunable": [3, 0]}).iloc[0]
    assert row.pick == 1 and row.held_out == "0 3" and row.pick_score == pytest.approx(0.85)
    assert pd.isna(row.runner_up) or row.runner_up == 2  # no draw picks trial 0


def test_the_guards_trials_are_read_from_the_tuned_files_history(tmp_path):
    """A later version's tuning replaces the arm's section; the trials v7's guard held out stay in git."""
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    tuned = tmp_path / "pydoc.yaml"

    def section(version: int, unstable: dict | None) -> dict:
        provenance = {"protocol": {"version": version}}
        if unstable is not None:
            provenance["stability"] = {"radius": 0.3, "unstable": unstable}
        return {"lr": 1.0, "provenance": provenance}

    for sections in (
        {"adamw": section(6, None), "horst": section(6, None)},
        {"adamw": section(7, {}), "horst": section(7, {3: "trial 4, 0.247 from it (radius 0.3), failed"})},
        {"adamw": section(8, {}), "horst": section(8, {5: "trial 5 failed at seed 100"})},
    ):
        tuned.write_text(yaml.safe_dump(sections))
        subprocess.run([*git, "add", tuned.name], check=True)
        subprocess.run([*git, "commit", "-qm", "a version's picks"], check=True)
    assert guarded(tuned, 7) == {"adamw": {}, "horst": {3: "trial 4, 0.247 from it (radius 0.3), failed"}}
    assert guarded(tuned, 8) == {"adamw": {}, "horst": {5: "trial 5 failed at seed 100"}}
    assert guarded(tuned, 6) == {}  # no guard ran: the plain rule
