"""`make check-results`: per pipeline, CHECKED_ARM's cell at the preset's last sparsity rerun into a
scratch folder and judged by the kind of check its record allows, bit for bit or within the committed
seeds' spread (horst_sparse.analysis.reruns says which and why); and the runs a version from
REPRODUCIBLE_SINCE on must not hold, those made outside the reproducible CPU mode.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence

import pandas as pd

from horst_sparse.analysis.matched import final_numbers
from horst_sparse.analysis.reruns import KEYS, exactly, in_reproducible_mode, machines, within_spread
from horst_sparse.analysis.runs import read_record, scan
from horst_sparse.paths import REPO

CHECKED_ARM = "horst"  # the arm the claims are about: its cell at the preset's last (highest) sparsity
RERUN_SEEDS = 3  # reruns of a record made outside the reproducible mode: its first reporting seeds
REPRODUCIBLE_SINCE = 7  # the first protocol version registered after the reproducible CPU mode: its runs are in it


def unreproducible_runs(frame: pd.DataFrame, version: int | None) -> list[str]:
    """The runs of a protocol version from REPRODUCIBLE_SINCE on that were not made in the reproducible
    CPU mode (such a version's record must rerun bit for bit on any x86 CPU); none for earlier ones."""
    if version is None or version < REPRODUCIBLE_SINCE or frame.empty:
        return []
    outside = frame[~frame.reproducible_cpu.map(lambda v: str(v) == "True")] if "reproducible_cpu" in frame else frame
    return sorted(outside.run.unique())


def check_results(study: str, *, extra: Sequence[str] = (), pipelines: Sequence[str] | None = None) -> int:
    """The module's check: 0 where the record reproduces in its sense, 1 where it does not or there is
    nothing to compare. A pipeline whose cell the current version has not run yet (no row of its
    runs at all: a version registered, its runs to come) is named and passed over; one whose runs
    the record holds at another config fails."""
    from horst_sparse.study.jobs import preset_config, presets_of, study_jobs
    from horst_sparse.study.run import run_multiruns

    record = final_numbers(read_record([REPO / "results" / study / "runs.csv"]))  # curve points are not compared
    jobs = [j for j in study_jobs(presets_of(study, pipelines), extra) if j.config.get("arm") == CHECKED_ARM]
    if not jobs:
        print(f"no job of arm {CHECKED_ARM} in the study's presets: nothing to check")
        return 1
    worst, checked = 0, 0
    for pipeline in dict.fromkeys(j.pipeline for j in jobs):
        mine = [j for j in jobs if j.pipeline == pipeline]
        cell = [j for j in mine if j.overrides == mine[-1].overrides]  # the preset's last cell, every seed
        committed = record[record.run.isin({j.run for j in cell}) & record.signature.isin({j.signature for j in cell})]
        committed = committed.drop_duplicates(["run", *KEYS])
        if not record.run.isin({j.run for j in cell}).any():
            print(f"{pipeline}: {cell[0].run} is not in the record yet (its version's runs are to come); not checked")
            continue
        checked += 1
        if committed.empty:
            print(f"{cell[0].run}: not in the record as a run of this job's config; nothing to compare")
            worst = 1
            continue
        seeds = sorted(j.seed for j in cell)
        first_run = committed[committed.seed == seeds[0]]
        exact = in_reproducible_mode(first_run)
        rerun_seeds = seeds[:1] if exact else seeds[:RERUN_SEEDS]
        kind = "bit for bit" if exact else f"within the committed spread of {committed.run.nunique()} seeds"
        print(f"\n## {pipeline}: {' '.join(cell[0].overrides)}, seed(s) {rerun_seeds} rerun; check: {kind}")
        with tempfile.TemporaryDirectory(prefix="check-results-") as scratch:
            line = [
                *cell[0].overrides,
                f"seed={','.join(map(str, rerun_seeds))}",
                f"hydra.sweep.dir={scratch}",
                "hydra.sweep.subdir=seed${seed}",
            ]
            side_by_side = (preset_config(cell[0].preset).get("hydra", {}).get("launcher") or {}).get("n_jobs")
            if side_by_side and not any(o.startswith("hydra/launcher=") for o in extra):
                line.append(f"hydra.launcher.n_jobs={len(rerun_seeds)}")  # the reruns all at once: one round
            run_multiruns([(cell[0].preset, line)], extra)
            reruns = final_numbers(scan([scratch]).frame)
        if unfinished := sorted(set(rerun_seeds) - set(reruns.seed[reruns.status.isin(["done", "diverged"])])):
            print(f"the rerun of seed(s) {unfinished} did not finish (neither done nor diverged): no verdict")
            worst = 1
            continue
        print(f"committed on: {machines(committed)}\nrerun on: {machines(reruns)}")
        if exact and not in_reproducible_mode(reruns):
            print("the rerun was not in the reproducible CPU mode (see above): bit for bit cannot be asked of it")
            worst = 1
            continue
        judge = exactly if exact else within_spread
        worst = max(worst, judge(committed, reruns, rerun_seeds))
    if not checked:
        print("no pipeline's cell is in the record yet: nothing was checked")
        return 1
    return worst
