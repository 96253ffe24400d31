"""A study's results folder: its README (what ran, from which commits, at what cost) and, with a
protocol, one report per version with the study's claims and headline over all of them."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from horst_sparse.analysis.reruns import machine_text
from horst_sparse.paths import REPO
from horst_sparse.study.budget import tuning_runs
from horst_sparse.study.jobs import Job, by_pipeline, command, preset_config


def readme(
    study: str,
    frame: pd.DataFrame,
    jobs: Sequence[Job],
    extra: Sequence[str],
    split: str,
    out: Path,
    protocol: Any = None,
) -> str:
    """The results folder's README: what ran, from which commits and protocol, how to rewrite it, the cost."""
    mine = frame if protocol is None else frame[frame["protocol"] == protocol.version]
    commits = ", ".join(f"`{c[:12]}`" for c in sorted(mine.git_commit.dropna().unique())) or "none yet"
    presets = list(dict.fromkeys(j.preset for j in jobs))
    lines = "\n".join(f"    {shlex.join(command(p, [], extra))}" for p in presets)
    hours = mine.drop_duplicates("run").wall_time_s.sum() / 3600
    folder = out.relative_to(REPO) if out.is_relative_to(REPO) else out
    default = {"demo": Path("outputs/demo"), "embedded": Path("results/embedded")}.get(study)
    flags = (" --demo" if study == "demo" else "") + (f" --out {folder}" if folder != default else "")
    target = {" --demo": "make demo", " --demo --out results/demo": "make demo-reference", "": "make study"}.get(
        flags, ""
    )
    versioned = ""
    if protocol is not None:
        retuned = "".join(f", and tunes {p}'s {a} anew" for p, a in sorted(protocol.retuned))
        inherited = protocol.spec.get("tunings_from")
        taken = (
            f", at the picks of protocol v{inherited}'s tunings (the same files and budget; it differs in its "
            f"declared edges{retuned})"
            if inherited
            else ""
        )
        versions = frame.drop_duplicates(["protocol", "run"]).protocol.value_counts().sort_index()
        earlier = ", ".join(f"v{v} {n}" for v, n in versions.items() if v != protocol.version)
        counts = mine.drop_duplicates("run").pipeline.value_counts()
        so_far = ", ".join(f"{p} {n}" for p, n in counts.items()) or "none"
        versioned = (
            f"It runs protocol {protocol.label} ({protocol.path.relative_to(REPO)}, hash `{protocol.hash}`), "
            f"fixed before its runs{taken}. `runs.csv` holds every version's runs (its `protocol` column); each "
            "version is judged by its own rules in v<N>/, and claims.md and the headline below show every "
            f"version's verdicts, each labelled. The earlier versions' runs: {earlier}; this version's so far: "
            f"{so_far}.\n\n"
        )
    return f"""# The {study} study

Written by `horst-sparse study{flags}`{f" ({target})" if target else ""}:
{mine.run.nunique()} of {len(jobs)} planned runs, measured on the {split} split, from commit(s) {commits}
({hours:.1f} h of run time). {versioned}The runs are the multiruns of the study's presets
(configs/study/, arms in configs/experiment/; each preset's header says what it runs):

{lines}

`runs.csv` is the record (one line per run and number; the study resumes from it). The tables,
paired differences, the claims' verdicts, the power table and the figures are written from it,
by `horst-sparse study{flags} --report-only` (no runs);
`horst-sparse study-report {folder}/runs.csv --out <folder>` writes the same tables and
figures into another folder. `make check-results` reruns HORST's last cell per pipeline and says
whether the record reproduces (bit for bit, or within its seeds' spread: horst_sparse/study/check.py).

## Cost, as measured

Tuning (`horst-sparse tune` per arm with the protocol's budget: the same trials, reruns of the best and
cells for every arm of a pipeline, on the validation split; results/tuning/) and the runs:

{cost_table(mine, jobs)}
"""


def cost_table(frame: pd.DataFrame, jobs: Sequence[Job]) -> str:
    """Per pipeline: runs done of planned, the measured wall time a run, the tuning runs, and
    what the whole (tuning + runs) takes at that rate with the preset's runs side by side."""
    from horst_sparse.analysis import tables

    runs = frame.drop_duplicates("run")
    rows = []
    for pipeline, group in by_pipeline(jobs).items():
        done = runs[runs.run.isin({j.run for j in group})]
        tuning = {arm: tuning_runs(group[0].provenance(arm)) for arm in sorted({j.config["tuned_as"] for j in group})}
        side_by_side = preset_config(group[0].preset).get("hydra", {}).get("launcher", {}).get("n_jobs", 1)
        median = done.wall_time_s.median() if not done.empty else math.nan
        rows.append(
            {
                "pipeline": pipeline,
                "runs done": f"{len(done)} of {len(group)}",
                "wall s a run (median)": f"{median:.0f}",
                "run time so far (h)": f"{done.wall_time_s.sum() / 3600:.1f}",
                "tuning runs per arm": ", ".join(f"{arm} {n if n else 'untuned'}" for arm, n in tuning.items()),
                "runs side by side": side_by_side,
                "tuning + runs at that rate (h wall)": f"{(len(group) + sum(tuning.values())) * median / side_by_side / 3600:.1f}",
            }
        )
    machine = ", ".join(sorted({machine_text(r) for r in runs.dropna(subset=["host"]).itertuples()})) or "not recorded"
    return tables.markdown(pd.DataFrame(rows).replace("nan", "–"), right=0) + f"\nMachine: {machine}.\n"


def repeats(frame: pd.DataFrame, versions: Sequence[Any]) -> dict[int, dict[str, int]]:
    """{version: {pipeline: earlier version}}: the pipelines whose runs under a version are an earlier
    version's runs counted again (the same runs at the same commits), not a new set of runs."""

    def runs(version: int, pipeline: str) -> set:
        rows = frame[(frame["protocol"] == version) & (frame.pipeline == pipeline)]
        return set(zip(rows.run, rows.git_commit))

    found: dict[int, dict[str, int]] = {}
    numbers = [v.version for v in versions]
    for i, version in enumerate(numbers):
        for pipeline in sorted(set(frame[frame["protocol"] == version].pipeline)):
            mine = runs(version, pipeline)
            if earlier := next((e for e in numbers[:i] if runs(e, pipeline) == mine), None):
                found.setdefault(version, {})[pipeline] = earlier
    return found


def label(protocol: Any, repeated: dict[str, int]) -> str:
    """One label per set of runs: the version's status names only its new runs; a pipeline whose runs
    an earlier version made is named as that version's."""
    if not repeated:
        return protocol.label
    again = "; ".join(f"{pipeline}: v{earlier}'s runs" for pipeline, earlier in sorted(repeated.items()))
    return f"v{protocol.version} ({protocol.status} for its new runs; {again})"


def _pointed(text: str, rules: dict[str, Any], again: dict[str, int], line: str, words: str) -> str:
    """Each set of runs once: the line (regex `line`, from its start) of each claim of a pipeline whose
    runs an earlier version made is replaced by `words`, pointing to that version ({id}, {v})."""
    for claim in rules["claims"]:
        if claim["pipeline"] in again:
            found = line.format(id=re.escape(str(claim["id"])))
            text = re.sub(rf"^{found}.*$", words.format(id=claim["id"], v=again[claim["pipeline"]]), text, flags=re.M)
    return text


def write_versions_report(
    frame: pd.DataFrame,
    out: Path,
    versions: Sequence[Any],
    *,
    split: str,
    folders: dict[str, Path],
    source: str,
    intro: str,
) -> None:
    """One report per protocol version (out/v<N>/, judged by that version's rules), and the
    study's claims.md, headline.md and README.md holding every version's verdicts, each labelled,
    and plain.md: the newest version's verdicts read plainly (the README's plain reading)."""
    from horst_sparse.analysis import claims, report

    claims_parts, headlines, plain = [], [], ""
    repeated = repeats(frame, versions)
    for protocol in reversed(versions):  # the newest first
        rows = frame[frame["protocol"] == protocol.version]
        if rows.empty:
            continue
        rules = claims.load_rules(protocol.claims)
        rules["source"] = str(protocol.claims.relative_to(REPO))
        folder = out / f"v{protocol.version}"
        named = label(protocol, again := repeated.get(protocol.version, {}))
        legend = f"Protocol {named} ({protocol.path.relative_to(REPO)}): {protocol.why}"
        text = report.write_report(
            rows,
            folder,
            rules=rules,
            split=split,
            folders=folders,
            source=f"{source}, protocol {protocol.version}",
            intro=f"# The {protocol.study} study, protocol {named}\n\n{legend}\n",
        )
        claims_parts.append(f"# Protocol {named}\n\n{legend}\n\n{text}")
        body = (folder / "headline.md").read_text().split("\n", 1)[1].rsplit(report.HEADLINE_END, 1)[0].strip()
        body = _pointed(body, rules, again, r"- Claim {id}: ", "- Claim {id}: v{v}'s runs (shown under v{v})")
        headlines.append(f"**Protocol {named}** ({protocol.path.relative_to(REPO)}; v{protocol.version}/):\n\n{body}")
        if not plain:  # the newest version's, read plainly
            reading = _pointed(
                (folder / "plain.md").read_text(),
                rules,
                again,
                r"\* \*\*Claim {id} ",
                "* **Claim {id}:** v{v}'s runs, read under v{v}.",
            )
            plain = (
                f"Read plainly, for protocol {named} (generated by its rules from v{protocol.version}/claims.csv; "
                f"intervals at {100 * rules['confidence']:g} %):\n\n{reading}"
            )
    (out / "claims.md").write_text("\n\n".join(claims_parts))
    headline = "\n".join([report.HEADLINE_START, "", "\n\n".join(headlines), "", report.HEADLINE_END]) + "\n"
    (out / "headline.md").write_text(headline)
    (out / "plain.md").write_text("\n".join([report.PLAIN_START, "", plain.rstrip(), "", report.PLAIN_END]) + "\n")
    (out / "README.md").write_text(intro + "\n" + headline)
