"""Where a study's numbers come from: a clean tree, runs and picks of this commit's code, and the
protocol's files as its registration left them (horst_sparse.study.protocol)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from horst_sparse.paths import REPO
from horst_sparse.study import protocol as protocols
from horst_sparse.study.jobs import Job, StudyError

# What a run's numbers depend on: the libraries, the pipelines and their scaffolding, the configs
# (not the results layer, the study's own code, the tuning's sampler, the planner or the fingerprint:
# no run reads them)
CODE = (
    *("horst", "pruning", "horst_sparse", "configs"),
    *(f":(exclude)horst_sparse/{p}" for p in ("analysis", "study", "sobol.py", "tune.py", "plan.py", "fingerprint.py")),
)


# ... of which a run's signature (its composed config) holds all a run reads: a change there that
# matters makes the run stale, one that does not (another pipeline's pick, a preset's sweep order,
# a new arm) leaves it valid. (Not the recipes: one sets an environment variable, outside the config.)
SIGNED = ("configs/tuned", "configs/study", "configs/experiment")


def _git(*args: str, repo: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def uncommitted(repo: Path = REPO, allowed: Callable[[str], bool] = lambda path: False) -> list[str]:
    """The working tree's changes (`git status --porcelain` lines) but those in results/, a study's
    and a tuning's own output, and those whose path `allowed` allows."""
    lines = _git(
        "status", "--porcelain", "--untracked-files=all", "--", ".", ":(exclude)results", repo=repo
    ).splitlines()
    return [line.strip() for line in lines if not allowed(line[3:].strip())]


def check_clean(repo: Path = REPO, allowed: Callable[[str], bool] = lambda path: False) -> None:
    """Refuse a tree with changes outside results/ (and those `allowed`): every number must come from a commit."""
    if changed := uncommitted(repo, allowed):
        raise StudyError(
            f"the working tree has uncommitted changes ({len(changed)} files, e.g. {changed[0]}): "
            "commit or stash them, so every run records a commit that holds its code"
        )


def check_provenance(commits: Sequence[str], repo: Path = REPO, reviewed: set = frozenset()) -> None:
    """Refuse runs (and picks) from a dirty tree, and those whose commit's code differs from HEAD's
    in CODE. The picks and presets (SIGNED) are left to the signature check: a pick a run reads is
    in its config (optimizer.*, train.*), so a changed one makes the run stale, while a pick
    committed after it for another pipeline or optimizer changes nothing it ran. A `reviewed`
    change (protocol.reviewed: a file's exact blobs before and after) is forgiven; any other
    change to that file is not."""
    head = _git("rev-parse", "HEAD", repo=repo).strip()
    problems = []
    for commit in sorted(set(commits)):
        if commit.endswith("-dirty"):
            problems.append(f"{commit[:12]}-dirty: ran from a tree with uncommitted changes (its code is not recorded)")
            continue
        try:
            files = _git(
                "diff", "--name-only", commit, head, "--", *CODE, *(f":(exclude){p}" for p in SIGNED), repo=repo
            ).split()
        except subprocess.CalledProcessError:
            problems.append(f"{commit[:12]}: not a commit of this repository")
            continue
        if changed := [f for f in files if not protocols.is_reviewed(f, (commit, head), reviewed, repo)]:
            problems.append(
                f"{commit[:12]}: its code differs from HEAD's in {len(changed)} file(s): {', '.join(changed[:5])}"
            )
    if problems:
        raise StudyError(
            "the study's runs did not all run this commit's code; rerun them (delete their rows of "
            "runs.csv and their folders) or check out their commit:\n  " + "\n  ".join(problems)
        )


def picks(jobs: Sequence[Job]) -> set[tuple[int | None, str]]:
    """(protocol version, commit) of each pick the jobs run at (horst-sparse tune's provenance)."""
    made = [job.provenance() for job in jobs]
    return {((p.get("protocol") or {}).get("version"), p["commit"]) for p in made if p.get("commit")}


def check_protocol(current: Any, versions: Sequence[Any], rows: pd.DataFrame, jobs: Sequence[Job]) -> None:
    """Before new tunings and runs: the files of the current version, and of the version whose
    tunings it takes, are as their registrations left them, in the working tree and at every
    commit their rows and picks were made at (protocol.check_unchanged)."""
    reviewed = protocols.reviewed(versions)
    made = picks(jobs)
    earlier = protocols.tuned_under(current, versions)
    protocols.check_unchanged(
        current, [None, *rows.git_commit.dropna(), *(c for v, c in made if v == current.version)], reviewed
    )
    if earlier is not current:
        protocols.check_unchanged(earlier, [None, *(c for v, c in made if v == earlier.version)], reviewed)
