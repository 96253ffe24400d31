"""Tuning curves (horst_sparse.analysis.tuning_curves, over opda): the median best of k trials with
its simultaneous band, the arms' order at every budget, failed trials at the worst end, and the
command's files."""

from __future__ import annotations

import itertools
import math
import subprocess

import numpy as np
import pandas as pd
import yaml
from conftest import HORST_SPARSE

from horst_sparse.analysis.tuning_curves import axis_range, curves, expected_best, order, verdict


def record(scores: dict[str, list[float]]) -> pd.DataFrame:
    rows = [
        {"arm": arm, "trial": i, "score": s, "metric": "validation top-1"}
        for arm, ss in scores.items()
        for i, s in enumerate(ss)
    ]
    return pd.DataFrame(rows)


def test_a_dominating_arm_leads_at_every_budget_and_the_bands_hold_the_curve():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.3, 0.8, 16)
    trials = record({"adamw": list(base), "horst": list(base + 0.1)})
    curve = curves(trials, maximize=True, support=(0.0, 1.0))
    for _, arm in curve.groupby("arm"):
        assert (np.diff(arm["median"]) >= 0).all() and (
            np.diff(arm["expected"]) >= -1e-12
        ).all()  # more trials never hurt
        assert (arm.low <= arm["median"] + 1e-12).all() and (arm["median"] <= arm.high + 1e-12).all()
        assert arm["median"].iloc[-1] <= arm["median"].max() and arm.k.tolist() == list(range(1, 17))
    assert set(order(curve, maximize=True).values()) == {("horst", "adamw")}
    assert verdict(curve, maximize=True).startswith("The arms' order (horst > adamw) is the same at every budget")


def test_minimizing_mirrors_maximizing_and_a_failed_trial_is_the_worst():
    scores = [60.0, 55.0, math.inf, 70.0, 52.0, 65.0, 58.0, 61.0]
    low = curves(record({"a": scores}), maximize=False, support=(1.0, math.inf))
    high = curves(record({"a": [-s for s in scores]}), maximize=True, support=(-math.inf, -1.0))
    # the same curve up to the empirical median's tie between the two middle trials (60 or 61) at k = 1
    np.testing.assert_allclose(low["median"].iloc[1:], -high["median"].iloc[1:])
    assert low["median"].iloc[0] in (60.0, 61.0) and -high["median"].iloc[0] in (60.0, 61.0)
    assert (np.diff(low["median"]) <= 0).all() and low["median"].iloc[-1] == 52.0  # lower is better here
    assert (low.high >= low["median"]).all() and math.isinf(low.expected.iloc[0])  # a failed draw: the worst end


def test_an_order_that_turns_with_the_budget_says_where_it_is_judged():
    """A reliable arm against a lucky one: the reliable one leads at one trial, the lucky one at eight."""
    trials = record(
        {"steady": [0.70 + i / 1000 for i in range(8)], "lucky": [0.2, 0.31, 0.25, 0.9, 0.3, 0.21, 0.35, 0.32]}
    )
    text = verdict(curves(trials, maximize=True, support=(0.0, 1.0)), maximize=True)
    assert "changes with the budget" in text and text.endswith(
        "k = 8: lucky > steady."
    )  # distinct scores: opda's bands assume no ties


def test_the_command_writes_its_table_and_figure(tmp_path):
    path = tmp_path / "tuning.csv"
    record({"adamw": [0.5, 0.6, 0.7, 0.65], "horst": [0.55, 0.62, 0.71, 0.6]}).to_csv(path, index=False)
    command = [HORST_SPARSE, "tuning-curves", str(path), "--maximize", "--support", "0", "1"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tuning_curves.png").stat().st_size > 10_000 and "| k | adamw | horst |" in done.stdout
    assert len(pd.read_csv(tmp_path / "tuning_curves.csv")) == 8
    stability = (tmp_path / "pick_stability.md").read_text()
    assert (
        stability.startswith(f"Written by `horst-sparse tuning-curves {path} --maximize")
        and "protocol" not in stability
    )
    assert "- adamw's pick (trial 2) changes in " in stability  # no reruns: the best search score
    assert pd.read_csv(tmp_path / "pick_stability.csv").top_k.eq(0).all()
    missing = subprocess.run([*command[:2], str(tmp_path / "none.csv")], capture_output=True, text=True)
    assert missing.returncode == 1 and missing.stderr.strip().startswith("error: no tuning record")


def test_a_versioned_record_with_reruns_gets_curves_of_its_search_stage_per_protocol(tmp_path):
    """Protocol 3 reran the top 2 of each arm's 6 trials at two more seeds; the curves are of the 6
    search trials, the pick is the best mean of the top 2, and a record that marks another trial says so."""
    search = {"adamw": [0.50, 0.60, 0.70, 0.65, 0.40, 0.45], "horst": [0.55, 0.62, 0.71, 0.60, 0.30, 0.35]}
    reruns = {
        ("adamw", 2): [0.60, 0.62],
        ("adamw", 3): [0.66, 0.64],
        ("horst", 2): [0.70, 0.72],
        ("horst", 1): [0.60, 0.61],
    }
    rows = record(search).assign(stage="search", seed=100, protocol=3)
    more = [
        {
            "arm": arm,
            "trial": trial,
            "score": s,
            "metric": "validation top-1",
            "stage": "rerun",
            "seed": 101 + i,
            "protocol": 3,
        }
        for (arm, trial), scores in reruns.items()
        for i, s in enumerate(scores)
    ]
    rows = pd.concat([rows, pd.DataFrame(more)], ignore_index=True)
    rows["pick"] = [(a, t) in {("adamw", 2), ("horst", 2)} for a, t in zip(rows.arm, rows.trial)]  # adamw's: stale
    path = tmp_path / "tuning.csv"
    rows.to_csv(path, index=False)
    command = [HORST_SPARSE, "tuning-curves", str(path), "--maximize", "--support", "0", "1"]
    done = subprocess.run([*command, "--draws", "300"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "tuning_curves.md").exists() and (tmp_path / "tuning_curves_v3.png").stat().st_size > 10_000
    assert len(pd.read_csv(tmp_path / "tuning_curves_v3.csv")) == 12  # the search stage alone
    curves_md = (tmp_path / "tuning_curves_v3.md").read_text()
    assert curves_md.startswith("Written by `horst-sparse tuning-curves") and "protocol v3, search stage" in curves_md
    table = pd.read_csv(tmp_path / "pick_stability.csv")
    assert table.columns.tolist() == [
        "protocol", "arm", "trials", "top_k", "seeds", "pick", "pick_score", "draws", "changed", "absent", "runner_up",
        "runner_up_share", "held_out",
    ]  # fmt: skip
    assert table[["protocol", "arm", "trials", "top_k", "seeds", "pick"]].values.tolist() == [
        [3, "adamw", 6, 2, 3, 3],
        [3, "horst", 6, 2, 3, 2],
    ]
    stability = (tmp_path / "pick_stability.md").read_text()
    assert "## Pick stability of adamw, horst, protocol v3" in stability
    assert "- adamw's pick (trial 3) changes in " in stability and " of 300 bootstrap draws" in stability
    assert "The record's pick column marks trial 2, not this rule's pick." in stability
    assert stability.count("not this rule's pick") == 1
    # a guard that held out horst's trial 2 (recorded in the tuned file, committed): horst's pick moves
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    tuned = tmp_path / "pydoc.yaml"
    why = "trial 2 failed at seed 100"
    tuned.write_text(
        yaml.safe_dump({"horst": {"provenance": {"protocol": {"version": 3}, "stability": {"unstable": {2: why}}}}})
    )
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", tuned.name], check=True)
    subprocess.run([*git, "commit", "-qm", "picks"], check=True)
    guarded = subprocess.run([*command, "--draws", "300", "--tuned", str(tuned)], capture_output=True, text=True)
    assert guarded.returncode == 0, guarded.stderr
    table = pd.read_csv(tmp_path / "pick_stability.csv")
    assert table[["arm", "pick"]].values.tolist() == [["adamw", 3], ["horst", 1]] and table.held_out.tolist()[1] == 2
    stability = (tmp_path / "pick_stability.md").read_text()
    assert f"held out trial 2 ({why}), here too" in stability and "top 2 trials by search score that the" in stability
    missing = subprocess.run([*command, "--tuned", str(tmp_path / "none.yaml")], capture_output=True, text=True)
    assert missing.returncode == 1 and missing.stderr.startswith("error: no tuned file")


def test_trials_a_later_version_ran_again_are_compared_and_copied_rows_are_not():
    """v4 redid v3's AdamW tuning on the same points and seeds: each pair scored alike or not; the
    rows v2 holds of v1 (the same runs, one commit) are no rerun."""
    from horst_sparse.analysis.tuning_curves import repeats, repeats_markdown

    def rows(protocol, commit, scores, alpha=None, lr=(0.1, 0.2, 0.3)):
        return pd.DataFrame(
            {"arm": "adamw", "stage": "search", "trial": range(len(scores)), "seed": 100, "train.lr": lr,
             "optimizer.alpha": alpha, "score": scores, "protocol": protocol, "commit": commit}
        )  # fmt: skip

    record = pd.concat(
        [
            rows(1, "a", [0.5, 0.6, 0.7], lr=(1, 2, 3)),
            rows(2, "a", [0.5, 0.6, 0.7], lr=(1, 2, 3)),  # recorded after the fact: v1's rows again
            rows(3, "b", [0.5, 0.6, 0.7]),
            rows(4, "c", [0.5, 0.6, 0.75]),
            rows(4, "c", [0.5, 0.6, 0.7], alpha=1.0).assign(arm="ham"),  # another point: no pair
        ],
        ignore_index=True,
    )
    table = repeats(record)
    assert table.drop(columns="max_difference").values.tolist() == [["adamw", 3, 4, 3, 2]]
    assert abs(table.max_difference.iloc[0] - 0.05) < 1e-12
    assert (
        "- adamw: 3 trials of protocol v3 at the same points and seeds under v4; 2 scored the same"
        in repeats_markdown(table, title="t")
    )


def test_the_figure_is_scaled_to_the_curves_not_to_an_unbounded_band():
    """Eight GPT-2-like trials cannot bound the band's lower edge short of perplexity 1 (the
    support's end); the axis spans the medians and the bounded edges, so the curves stay apart."""
    scores = [72.0, 48.5, 160.0, 55.0, 61.0, 90.0, 66.0, 58.0]
    curve = curves(record({"ham": scores}), maximize=False, support=(1.0, math.inf))
    assert (curve.low == 1.0).any()  # the case this is for
    bottom, top = axis_range(curve, support=(1.0, math.inf), log_y=True)
    assert 1.0 < bottom < curve["median"].min() and curve["median"].max() < top < math.inf
    bounded = curve.low[curve.low > 1.0]
    assert bottom <= bounded.min()


def test_the_expected_best_is_the_mean_best_over_every_subset_drawn_without_replacement():
    scores = np.array([60.0, 55.0, math.inf, 70.0, 52.0, 65.0, math.inf])
    for maximize, sign in ((False, 1.0), (True, -1.0)):
        got = expected_best(sign * scores, np.arange(1, 8), maximize=maximize)
        best = max if maximize else min
        brute = [np.mean([best(c) for c in itertools.combinations(sign * scores, k)]) for k in range(1, 8)]
        np.testing.assert_allclose(got, brute)
    # two failed trials: the worst end at k <= 2 only, finite from k = 3 (with replacement: never)
    got = expected_best(scores, np.arange(1, 8), maximize=False)
    assert np.isinf(got[:2]).all() and np.isfinite(got[2:]).all() and got[-1] == 52.0


def test_a_version_that_runs_an_earlier_tuning_gets_curves_of_every_arm_it_ran(tmp_path):
    """v2 retunes horst alone and runs adamw at v1's pick: its as-run curves hold v2's horst and v1's adamw."""
    v1 = record({"adamw": [0.5, 0.6, 0.7], "horst": [0.4, 0.5, 0.6]}).assign(protocol=1, stage="search", seed=100)
    v2 = record({"horst": [0.65, 0.75, 0.8]}).assign(protocol=2, stage="search", seed=100)
    path = tmp_path / "tuning.csv"
    pd.concat([v1, v2], ignore_index=True).to_csv(path, index=False)
    command = [HORST_SPARSE, "tuning-curves", str(path), "--maximize", "--support", "0", "1"]
    done = subprocess.run([*command, "--draws", "50", "--inherit", "2=1"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ran = pd.read_csv(tmp_path / "tuning_curves_v2_as_run.csv")
    assert sorted(set(ran.arm)) == ["adamw", "horst"] and ran[ran.arm == "horst"]["median"].iloc[-1] == 0.8
    assert "protocol v2 as run (adamw: v1's tuning)" in (tmp_path / "tuning_curves_v2_as_run.md").read_text()
    assert set(pd.read_csv(tmp_path / "tuning_curves_v2.csv").arm) == {"horst"}  # its own tuning, as before
    refused = subprocess.run([*command, "--inherit", "2=7"], capture_output=True, text=True)
    assert refused.returncode != 0 and refused.stderr.strip() == (
        "error: --inherit 2=7: the record has no tuning of protocol v7"
    )
