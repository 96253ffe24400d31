"""`horst-sparse study`: plan a study's jobs (horst_sparse.study.jobs), check where its numbers come from
(provenance, the protocol's budget: budget), run the tunings and the jobs not done through Hydra's
multirun and the presets' launcher, and write its record and report (report)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from horst_sparse.analysis.report import write_report
from horst_sparse.analysis.reruns import compare_with_reference
from horst_sparse.analysis.runs import RECORD_COLUMNS, NoRunsError, read_record, write_record
from horst_sparse.paths import REPO
from horst_sparse.study import protocol as protocols
from horst_sparse.study.budget import check_budgets, tunings
from horst_sparse.study.check import check_results, unreproducible_runs
from horst_sparse.study.jobs import (
    StudyError,
    command,
    multiruns,
    preset_config,
    presets_of,
    runs_of,
    stale,
    study_jobs,
)
from horst_sparse.study.provenance import check_clean, check_protocol, check_provenance, picks
from horst_sparse.study.report import readme, write_versions_report


def _run(line: list[str], program: str) -> int:
    """`line` shown and run with `program` as its first word: offline, OpenMP threads passive."""
    print(f"$ {shlex.join(line)}", flush=True)
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.call([program, *line[1:]], cwd=REPO, env=env)


def run_multiruns(commands: Sequence[tuple[str, list[str]]], extra: Sequence[str] = ()) -> int:
    """The multiruns one after another (each one's launcher runs its jobs side by side); the worst status."""
    return max((_run(command(preset, overrides, extra), sys.executable) for preset, overrides in commands), default=0)


def run_tunings(lines: Sequence[list[str]]) -> None:
    """The tunings one after another, then stop: the study's runs start from a commit that holds the picks."""
    for line in lines:  # the command installed beside this Python, so that a pick's made_by is the line shown
        if _run(line, str(Path(sys.executable).parent / line[0])):
            raise StudyError(f"the tuning `{shlex.join(line)}` failed (see above); fix it and run the study again")
    raise StudyError(
        f"{len(lines)} arm(s) tuned: commit the picks (git add configs/tuned results/tuning && git commit), "
        "then run the study again; its runs must come from a commit that holds them"
    )


def picks_being_written(missing: Sequence[list[str]]) -> Callable[[str], bool]:
    """The tuned files a study stopped between its tunings has written and not yet committed: those of
    the pipelines with an arm still to tune. It resumes beside them (each tuning refuses its own arm's
    section uncommitted), and no run starts before they are committed (run_tunings stops the study)."""
    pipelines = {line[2] for line in missing}
    return lambda path: any(path.startswith(f"configs/tuned/{pipeline}/") for pipeline in pipelines)


def run_study(
    study: str,
    *,
    extra: Sequence[str] = (),
    report_only: bool = False,
    out: Path | None = None,
    pipelines: Sequence[str] | None = None,
) -> int:
    """Plan, check, launch what is missing, report into `out` (default results/<study>, whose
    runs.csv it resumes from). A study with a protocol (protocols/<study>/) runs its newest version
    and keeps every earlier version's rows in the record; the report judges each version apart.
    `pipelines` limits what is tuned and run, not what is reported: the record and the report
    always cover every preset of the study. 0 when every planned run finished."""
    out = Path(out or REPO / "results" / study)
    try:
        versions = protocols.versions(study)
    except protocols.ProtocolError:
        versions = []  # the demo: no comparison, no protocol
    current = versions[-1] if versions else None
    if current is not None and not current.presets:  # a version recorded after its runs names their commit instead
        raise StudyError(f"{current.path.relative_to(REPO)} names no presets: the study has no version to run")
    presets = presets_of(study)
    chosen = presets_of(study, pipelines)
    # The command line's overrides are for the pipelines it runs; another pipeline's presets are
    # composed as they stand (a ViT key such as acdc.sparsity does not exist in GPT-2's config).
    every = study_jobs(chosen, extra) + study_jobs([p for p in presets if p not in chosen])
    jobs = [j for j in every if j.preset in chosen]
    record = out / "runs.csv"
    earlier = read_record([record]) if record.is_file() else pd.DataFrame(columns=RECORD_COLUMNS)
    version = None if current is None else current.version
    if not report_only:
        missing = tunings(current, jobs, versions) if current is not None else []
        check_clean(allowed=picks_being_written(missing))
    if current is not None and not report_only:
        mine = earlier[earlier["protocol"] == version] if "protocol" in earlier else earlier[:0]
        check_protocol(current, versions, mine, jobs)
        if missing:
            run_tunings(missing)
        check_budgets(jobs, current.declared_edges)
    frame, folders = runs_of(every, record, version)
    if problems := stale(every, frame, folders):
        raise StudyError(
            f"{len(problems)} finished run(s) were made with other settings than this code composes for "
            "their job; their numbers are not this code's. Delete their folders and rows of "
            f"{record.relative_to(REPO) if record.is_relative_to(REPO) else record} to rerun them:\n  "
            + "\n  ".join(problems)
        )
    if outside := unreproducible_runs(frame, version):
        raise StudyError(
            f"{len(outside)} run(s) of protocol v{version} were not made in the reproducible CPU mode, which its "
            f"record needs (bit for bit on any x86 CPU); rerun them without reproducible_cpu=false or "
            f"HORST_CPU_MODE=native (delete their folders and rows): {', '.join(outside[:3])}"
        )
    done = set(frame.run)
    todo = [j for j in jobs if j.run not in done]
    print(f"{len(todo)} of {len(jobs)} runs to do", flush=True)
    status = 0
    if todo and not report_only:
        # New runs join a record of this code's runs only (and, where the study is a comparison,
        # at picks this code made: a code change may move a tuning's optimum; the demo only shows
        # the pipelines at the picks they read). The picks are those the new runs read: another
        # pipeline's (tuned later, or at an earlier commit) changes nothing they compute. A report
        # adds no run: the record's numbers stand, each with its commit, whatever the code has become since.
        check_provenance(
            [*frame.git_commit.dropna().unique(), *(c for _, c in (picks(todo) if current else ()))],
            reviewed=protocols.reviewed(versions),
        )
        status = run_multiruns(multiruns(todo, extra), extra)
        frame, folders = runs_of(every, record, version)
    if current is not None:
        frame = frame.assign(protocol=current.version, protocol_hash=current.hash)
        others = earlier[earlier["protocol"] != current.version] if "protocol" in earlier else earlier[:0]
        frame = pd.concat([others, frame], ignore_index=True) if not others.empty else frame
    if frame.empty:
        raise NoRunsError("no run of the study has finished")
    out.mkdir(parents=True, exist_ok=True)
    write_record(frame, record)
    split = {preset_config(j.preset).get("eval_split", "validation") for j in every}.pop()
    source = str(record.relative_to(REPO) if record.is_relative_to(REPO) else record)
    intro = readme(study, frame, every, extra, split, out, current)
    if versions:
        write_versions_report(frame, out, versions, split=split, folders=folders, source=source, intro=intro)
    else:
        write_report(frame, out, split=split, folders=folders, source=source, intro=intro)
    mine = frame if current is None else frame[frame["protocol"] == current.version]
    missing = len(jobs) - mine.run.isin({j.run for j in jobs}).sum()
    return status or int(missing > 0)


def main(argv: Sequence[str] | None = None) -> None:
    """`horst-sparse study`: the embedded study, the demo, their reports and checks.

        horst-sparse study                            # make study: results/embedded/
        horst-sparse study --demo                     # make demo (<= 15 min on 2 cores): trains into outputs/demo/,
                                                      # then compares with the committed results/demo/
        horst-sparse study --demo --out results/demo  # make demo-reference: the committed reference
        horst-sparse study --report-only              # no runs: the report of the runs done
        horst-sparse study --check                    # make check-results: rerun one cell per pipeline, judged
                                                      # bit for bit or against its seeds' spread (study/check.py)
        horst-sparse study hydra/launcher=slurm       # extra overrides go to every multirun

    Refuses a dirty tree (but for the picks of a study stopped between its tunings), arms not tuned alike (the embedded study), new runs beside runs of
    other code, and finished runs whose config is not what the presets now compose (stale)."""

    from horst_sparse.cli import subcommand
    from horst_sparse.pipeline import names
    from horst_sparse.study.protocol import ProtocolError
    from horst_sparse.training.config import RunError

    parser = subcommand("study", main.__doc__)
    parser.add_argument("--demo", action="store_true", help="the demo (configs/study/demo_*.yaml) into outputs/demo")
    parser.add_argument("--report-only", action="store_true", help="run nothing; report the runs done")
    parser.add_argument(
        "--check",
        action="store_true",
        help="rerun HORST's last cell per pipeline: bit for bit where the record was made in the reproducible "
        "CPU mode, else a few seeds against the committed seeds' spread",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="the results folder (default: results/<study>; the demo's outputs/demo, "
        "compared with the committed results/demo)",
    )
    parser.add_argument("--pipeline", choices=names(), action="append", help="only this pipeline's part (repeatable)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every multirun, e.g. hydra/launcher=slurm")
    args = parser.parse_args(argv)
    study = "demo" if args.demo else "embedded"
    try:
        if args.check:
            sys.exit(check_results(study, extra=args.overrides, pipelines=args.pipeline))
        reference = REPO / "results" / "demo"
        out = args.out or (REPO / "outputs" / "demo" if args.demo else None)  # the demo never touches its reference
        started = time.monotonic()
        status = run_study(study, extra=args.overrides, report_only=args.report_only, out=out, pipelines=args.pipeline)
        if args.demo and out.resolve() != reference.resolve():
            print(f"\nThe demo's report: {out}/README.md")
            status = max(status, compare_with_reference(read_record([out / "runs.csv"]), reference / "runs.csv"))
            print(f"the demo took {(time.monotonic() - started) / 60:.1f} min here ({os.cpu_count()} CPUs)")
        sys.exit(status)
    except (StudyError, NoRunsError, RunError, ProtocolError) as error:  # RunError: the tuning's BudgetError
        sys.exit(f"error: {error}")
