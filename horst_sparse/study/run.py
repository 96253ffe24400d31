"""A study: the Hydra multiruns its presets define (`configs/study/<study>_<pipeline>.yaml`: arms,
sparsities, seeds as `hydra.sweeper.params`, the launcher), resumable from its committed record,
refused where the code or a config changed under its runs, then its results folder.

* **Plan.** Every job of each preset, composed as Hydra composes it (one composition per arm and
  sparsity: the seed is not in a run's signature): its run folder (`hydra.sweep.dir/subdir`, the
  run's id in the record) and the signature of its config.
* **Done.** A job is done when its run is in the record (`results/<study>/runs.csv`) or its folder
  holds `summary.json`. A done run whose signature differs from its job's is stale: the study stops,
  naming it (and, from a folder, the keys): a recipe, an arm or a default changed since it ran.
* **Provenance.** The study refuses to start from a dirty tree (`check_clean`), refuses runs that
  ran from one (commit `-dirty`), and where its runs span commits, refuses any whose code
  (`CODE`: horst/, pruning/, horst_sparse/training/, configs/) differs from this commit's (`git diff`), except
  by a reviewed change (a protocol version's retune: horst_sparse/study/protocol.py). A study with a
  protocol refuses new runs and tunings where its version's files changed since its registration.
* **Budgets.** The embedded study first runs the tunings its protocol's budget (protocols/embedded/v<N>.yaml)
  still asks for, `scripts/tune.py` per optimizer with the same trials, and stops for the picks to
  be committed; it refuses arms whose optimizers were not tuned alike (equal trials, validation
  split, tuning seeds disjoint from its seeds).
* **Launch.** The jobs not done go through Hydra's own multirun and the preset's launcher
  (joblib here, two jobs side by side; `hydra/launcher=slurm` on a cluster): one multirun per
  preset when nothing is done, else one per set of jobs that forms a sweep.
* **Report.** The record is rewritten from the runs (folders where present, else the record's
  rows), and `horst_sparse.analysis.report` writes the folder from the runs measured on the presets' split.
"""

from __future__ import annotations

import itertools
import math
import os
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from horst_sparse.analysis.report import write_report
from horst_sparse.analysis.runs import (
    RECORD_COLUMNS,
    UNRECORDED,
    NoRunsError,
    read_record,
    scan,
    signature,
    signature_hash,
    write_record,
)
from horst_sparse.compose import compose_in_context, hydra_context, sweep_jobs
from horst_sparse.paths import CONFIGS, REPO
from horst_sparse.pipeline import Pipeline
from horst_sparse.pipeline import get as get_pipeline
from horst_sparse.study.check import check_results, compare_with_reference, machine_text, unreproducible_runs

# What a run's numbers depend on: the libraries, the pipelines and their scaffolding, the configs
# (not the results layer or the study's own code, which read numbers and write none).
CODE = (
    "horst",
    "pruning",
    "horst_sparse",
    "configs",
    ":(exclude)horst_sparse/analysis",
    ":(exclude)horst_sparse/study",
)
# ... of which a run's signature (its composed config) holds all a run reads: a change there that
# matters makes the run stale, one that does not (another pipeline's pick, a preset's sweep order,
# a new arm) leaves it valid. (Not the recipes: one sets an environment variable, outside the config.)
SIGNED = ("configs/tuned", "configs/study", "configs/arm")


class StudyError(RuntimeError):
    pass


@dataclass(frozen=True)
class Job:
    pipeline: str
    preset: str
    overrides: tuple[str, ...]  # the job's sweep overrides without the seed, e.g. ("+arm=horst", "acdc.sparsity=0.9")
    seed: int
    run: str  # its folder, relative to the repository: the run's id in the record
    sweep_dir: str
    signature: str
    config: dict  # the composed job config (hydra node aside), for naming what a stale run differs in
    recipe: str  # the pipeline's recipe (<pipeline>_recipe), which its tuning runs on


def _git(*args: str, repo: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def check_clean(repo: Path = REPO) -> None:
    """Refuse a tree with changes outside results/: every number must come from a commit."""
    changed = _git("status", "--porcelain", "--", ".", ":(exclude)results", repo=repo).splitlines()
    if changed:
        raise StudyError(
            f"the working tree has uncommitted changes ({len(changed)} files, e.g. {changed[0][3:]}): "
            "commit or stash them, so every run records a commit that holds its code"
        )


def check_provenance(commits: Sequence[str], repo: Path = REPO, reviewed: set = frozenset()) -> None:
    """Refuse runs (and picks) from a dirty tree, and those whose commit's code differs from HEAD's
    in CODE. The picks and presets (SIGNED) are left to the signature check: a pick a run reads is
    in its config (optimizer.*, train.*), so a changed one makes the run stale, while a pick
    committed after it for another pipeline or optimizer changes nothing it ran. A `reviewed`
    change (protocol.reviewed: a file's exact blobs before and after) is forgiven; any other
    change to that file is not."""
    from horst_sparse.study.protocol import is_reviewed

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
        files = [f for f in files if not is_reviewed(f, (commit, head), reviewed, repo)]
        if files:
            problems.append(
                f"{commit[:12]}: its code differs from HEAD's in {len(files)} file(s): {', '.join(files[:5])}"
            )
    if problems:
        raise StudyError(
            "the study's runs did not all run this commit's code; rerun them (delete their rows of "
            "runs.csv and their folders) or check out their commit:\n  " + "\n  ".join(problems)
        )


def _preset(name: str, configs: Path = CONFIGS) -> dict[str, Any]:
    """A preset's YAML, over the presets its defaults list names (`- embedded_vit`: a sibling in
    configs/study/), merged as Hydra merges them."""
    from omegaconf import OmegaConf

    path = configs / "study" / f"{name}.yaml"
    if not path.is_file():
        raise StudyError(f"no study preset {path}")
    own = yaml.safe_load(path.read_text())
    bases = [
        _preset(entry, configs) for entry in own.get("defaults", []) if isinstance(entry, str) and entry != "_self_"
    ]
    return OmegaConf.to_container(OmegaConf.merge(*bases, own)) if bases else own


def pipeline_of(preset: str, configs: Path = CONFIGS) -> Pipeline:
    """The pipeline a study preset says it belongs to (its `pipeline:` key, or its base's)."""
    name = _preset(preset, configs).get("pipeline")
    if not name:
        raise StudyError(f"configs/study/{preset}.yaml has no `pipeline:` key: say which pipeline it runs")
    return get_pipeline(name)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _params(preset: str, extra: Sequence[str], configs: Path) -> dict[str, Any]:
    """The preset's sweep with the command line's overrides of its keys in place, as Hydra merges them."""
    params = _preset(preset, configs)["hydra"]["sweeper"]["params"]
    replaced = {_key(o): o.split("=", 1) for o in extra}
    return {
        (replaced[_key(k)][0] if _key(k) in replaced else k): (replaced[_key(k)][1] if _key(k) in replaced else v)
        for k, v in params.items()
    }


def study_jobs(presets: Sequence[str], extra: Sequence[str] = (), *, configs: Path = CONFIGS) -> list[Job]:
    """Every job of the presets (configs/study/), composed from `configs`. A job's seed is not in
    its signature, so each cell is composed once and its seeds set on the composed config."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    jobs = []
    for preset in presets:
        pipeline = pipeline_of(preset, configs)
        pipeline.configs.register()
        params = _params(preset, extra, configs)
        rest = [o for o in extra if _key(o) not in {_key(k) for k in params}]
        by_cell: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for job in sweep_jobs([f"{k}={v}" for k, v in params.items()]):
            seeds = [o for o in job if o.startswith("seed=")]
            by_cell[tuple(o for o in job if not o.startswith("seed="))] += [int(s.split("=", 1)[1]) for s in seeds]
        with hydra_context(configs, job_name="study"):
            for overrides, seeds in by_cell.items():
                config = compose_in_context(pipeline, [f"+study={preset}", *overrides, *rest])
                HydraConfig.instance().set_config(config)
                for seed in seeds:
                    with open_dict(config):
                        config.seed = seed
                    folder = Path(config.hydra.sweep.dir) / str(config.hydra.sweep.subdir)
                    job = OmegaConf.to_container(config, resolve=True)
                    del job["hydra"]
                    jobs.append(
                        Job(
                            pipeline.name,
                            preset,
                            overrides,
                            seed,
                            str(folder),
                            str(config.hydra.sweep.dir),
                            signature_hash(job),
                            job,
                            config.hydra.runtime.choices[pipeline.recipe_group],
                        )
                    )
        HydraConfig.instance().cfg = None  # set only to resolve the sweep folder: no job of this process runs
    return jobs


def runs_of(jobs: Sequence[Job], record: Path, version: int | None = None) -> tuple[pd.DataFrame, dict[str, Path]]:
    """The planned jobs' runs: from their folders where they finished, else from the record (its
    rows of protocol `version` where it has one)."""
    dirs = [d for d in sorted({REPO / j.sweep_dir for j in jobs}) if d.is_dir()]
    found = scan(dirs, base=REPO) if dirs else None
    parts = []
    if found is not None and not found.frame.empty:
        parts.append(found.frame)
    if record.is_file():
        rows = read_record([record])
        if version is not None and "protocol" in rows:
            rows = rows[rows["protocol"] == version]
        parts.append(rows[~rows.run.isin(found.frame.run if parts else [])])
    planned = {j.run for j in jobs}
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=RECORD_COLUMNS)
    # A run counts where it is one of the study's jobs and its config was recorded (records from before
    # signatures existed cannot be checked against their job: their jobs run again).
    mine = frame.run.isin(planned) & (frame.signature != UNRECORDED)
    return frame[mine].reset_index(drop=True), (found.folders if found else {})


def stale(jobs: Sequence[Job], frame: pd.DataFrame, folders: dict[str, Path]) -> list[str]:
    """`run: why` for every done run whose signature is not its job's."""
    from horst_sparse.training.runner import config_differences

    recorded = frame.drop_duplicates("run").set_index("run")["signature"]
    lines = []
    for job in jobs:
        if job.run in recorded and recorded[job.run] != job.signature:
            if job.run in folders:
                old = yaml.safe_load((folders[job.run] / "config.yaml").read_text())
                why = "; ".join(config_differences(signature(old), signature(job.config)))
            else:
                why = f"recorded signature {recorded[job.run]}, this code composes {job.signature}"
            lines.append(f"{job.run}: {why}")
    return lines


def multiruns(jobs: Sequence[Job], extra: Sequence[str] = ()) -> list[tuple[str, list[str]]]:
    """(preset, overrides) of the multiruns that run exactly `jobs`: a preset's whole sweep where
    all of its jobs are asked for, else one multirun per job cell with its seeds."""
    commands = []
    order = list(dict.fromkeys(j.preset for j in jobs))  # the study's order: a pipeline's presets, then the next's
    for preset, group in itertools.groupby(sorted(jobs, key=lambda j: order.index(j.preset)), key=lambda j: j.preset):
        group = list(group)
        if len(group) == len(sweep_jobs([f"{k}={v}" for k, v in _params(preset, extra, CONFIGS).items()])):
            commands.append((preset, []))
            continue
        cells: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for job in group:
            cells[job.overrides].append(job.seed)
        commands += [
            (preset, [*overrides, f"seed={','.join(map(str, sorted(seeds)))}"]) for overrides, seeds in cells.items()
        ]
    return commands


def command(preset: str, overrides: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """The multirun's command line; an extra override of a key the job overrides gives way to the job's."""
    mine = {_key(o) for o in overrides}
    rest = [o for o in extra if _key(o) not in mine]
    return ["python", pipeline_of(preset).script, "-m", f"+study={preset}", *overrides, *rest]


def _subprocess_env() -> dict[str, str]:
    """The environment of the study's subprocesses (tunings, multiruns): offline, passive OpenMP."""
    return {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def run_multiruns(commands: Sequence[tuple[str, list[str]]], extra: Sequence[str] = ()) -> int:
    """Run the multiruns one after another (each one's launcher runs its jobs side by side)."""
    env = _subprocess_env()
    worst = 0
    for preset, overrides in commands:
        line = command(preset, overrides, extra)
        print(f"$ {shlex.join(line)}", flush=True)
        worst = max(worst, subprocess.call([sys.executable, *line[1:]], cwd=REPO, env=env))
    return worst


def tuning_runs(record: Mapping[str, Any]) -> int:
    """The runs a tuning made (its provenance): every search trial and rerun, one run per cell."""
    from horst_sparse.study.tuning import cells

    per_trial = len(cells(record.get("tune_over")))
    return (record.get("trials", 0) + record.get("top_k", 0) * len(record.get("rerun_seeds") or [])) * per_trial


def cost_table(frame: pd.DataFrame, jobs: Sequence[Job]) -> str:
    """Per pipeline: runs done of planned, the measured wall time a run, the tuning runs, and
    what the whole (tuning + runs) takes at that rate with the preset's runs side by side."""
    runs = frame.drop_duplicates("run")
    rows = []
    for pipeline, group in itertools.groupby(sorted(jobs, key=lambda j: j.pipeline), key=lambda j: j.pipeline):
        group = list(group)
        done = runs[runs.run.isin({j.run for j in group})]
        tuned = {
            o: (group[0].config["tuned"].get(o) or {}).get("provenance") or {}
            for o in sorted({j.config["tuned_as"] for j in group})
        }
        tuning = {o: tuning_runs(record) for o, record in tuned.items()}
        side_by_side = _preset(group[0].preset).get("hydra", {}).get("launcher", {}).get("n_jobs", 1)
        median = done.wall_time_s.median() if not done.empty else math.nan
        rows.append(
            {
                "pipeline": pipeline,
                "runs done": f"{len(done)} of {len(group)}",
                "wall s a run (median)": median,
                "run time so far (h)": done.wall_time_s.sum() / 3600,
                "tuning runs per arm": ", ".join(f"{o} {n if n else 'untuned'}" for o, n in tuning.items()),
                "runs side by side": side_by_side,
                "tuning + runs at that rate (h wall)": (len(group) + sum(tuning.values()))
                * median
                / side_by_side
                / 3600,
            }
        )
    from horst_sparse.analysis import tables

    table = pd.DataFrame(rows)
    for column, digits in (
        ("wall s a run (median)", 0),
        ("run time so far (h)", 1),
        ("tuning + runs at that rate (h wall)", 1),
    ):
        table[column] = table[column].map(lambda v, digits=digits: "–" if math.isnan(v) else f"{v:.{digits}f}")

    machine = ", ".join(sorted({machine_text(r) for r in runs.dropna(subset=["host"]).itertuples()})) or "not recorded"
    return tables.markdown(table, right=0) + f"\nMachine: {machine}.\n"


def readme(
    study: str,
    frame: pd.DataFrame,
    jobs: Sequence[Job],
    extra: Sequence[str],
    split: str,
    out: Path,
    protocol: Any = None,
) -> str:
    mine = frame if protocol is None else frame[frame["protocol"] == protocol.version]
    commits = ", ".join(f"`{c[:12]}`" for c in sorted(mine.git_commit.dropna().unique()))
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
        counts = mine.drop_duplicates("run").pipeline.value_counts()
        versioned = (
            f"It runs protocol {protocol.label} ({protocol.path.relative_to(REPO)}, hash `{protocol.hash}`), "
            "fixed before its runs"
            + (
                f", at the picks of protocol v{protocol.spec['tunings_from']}'s tunings (the same files and budget; "
                "it differs in its declared edges"
                + "".join(f", and tunes {p}'s {a} anew" for p, a in sorted(protocol.retuned))
                + ")"
                if protocol.spec.get("tunings_from")
                else ""
            )
            + ". `runs.csv` holds every version's runs (its `protocol` column); each "
            "version is judged by its own rules in v<N>/, and claims.md and the headline below show every "
            "version's verdicts, each labelled. The earlier versions' runs: "
            + ", ".join(
                f"v{v} {n}"
                for v, n in frame.drop_duplicates(["protocol", "run"]).protocol.value_counts().sort_index().items()
                if v != protocol.version
            )
            + f"; this version's so far: {', '.join(f'{p} {n}' for p, n in counts.items()) or 'none'}.\n\n"
        )
    return f"""# The {study} study

Written by `horst-study{flags}`{f" ({target})" if target else ""}:
{mine.run.nunique()} of {len(jobs)} planned runs, measured on the {split} split, from commit(s) {commits}
({hours:.1f} h of run time). {versioned}The runs are the multiruns of the study's presets
(configs/study/, arms in configs/arm/; each preset's header says what it runs):

{lines}

`runs.csv` is the record (one line per run and number; the study resumes from it). The tables,
paired differences, the claims' verdicts, the power table and the figures are written from it,
by `horst-study{flags} --report-only` (no runs);
`horst-study-report {folder}/runs.csv --out <folder>` writes the same tables and
figures into another folder. `make check-results` reruns HORST's last cell per pipeline and says
whether the record reproduces (bit for bit, or within its seeds' spread: horst_sparse/study/check.py).

## Cost, as measured

Tuning (`horst-tune` per arm with the protocol's budget: the same trials, reruns of the best and
cells for every arm of a pipeline, on the validation split; results/tuning/) and the runs:

{cost_table(mine, jobs)}
"""


def presets_of(study: str, pipelines: Sequence[str] | None = None, configs: Path = CONFIGS) -> list[str]:
    """The study's presets: those its current protocol names (protocols/<study>/), else
    configs/study/<study>_*.yaml (the demo: no protocol); of every pipeline or of `pipelines` only."""
    from horst_sparse.study import protocol

    try:
        names = sorted(protocol.current(study).presets)
    except protocol.ProtocolError:
        names = sorted(f.stem for f in (configs / "study").glob(f"{study}_*.yaml"))
    presets = [n for n in names if pipelines is None or pipeline_of(n, configs).name in pipelines]
    if not presets:
        raise StudyError(
            f"no preset configs/study/{study}_*.yaml" + (f" of {', '.join(pipelines)}" if pipelines else "")
        )
    return presets


def check_budgets(jobs: Sequence[Job], declared_edges: Sequence[str] = ()) -> None:
    """Per pipeline: every set of tuned values the jobs read (adamw, ham, horst, horst_prunable) was
    tuned alike on validation with seeds disjoint from the jobs' reporting seeds, over nested
    spaces (horst_sparse.study.tuning's check, a BudgetError naming the arm otherwise)."""
    from horst_sparse.study.tuning import check_equal_budgets

    for _, group in itertools.groupby(sorted(jobs, key=lambda j: j.pipeline), key=lambda j: j.pipeline):
        group = list(group)
        # every set of tuned values a job reads (its `tuned_as`: an optimizer's, or an arm's own), so the
        # budget counts arms; a control reads another arm's values and is not tuned on its own
        tuned_sets = sorted({j.config["tuned_as"] for j in group})
        check_equal_budgets(
            group[0].config["tuned"],
            tuned_sets,
            reporting_seeds=sorted({j.seed for j in group}),
            declared_edges=declared_edges,
        )


def tunings(protocol: Any, jobs: Sequence[Job], versions: Sequence[Any] = ()) -> list[list[str]]:
    """The `horst-tune` command lines the protocol's budget (its `tuning`) still asks for: each set
    of tuned values its jobs read (`tuned_as`) whose pick was not made under this protocol version
    (a tuning already made is not redone). A version that takes an earlier one's tunings
    (`tunings_from`, `protocol.tuned_under`) runs at that version's picks and tunes anew only the
    arms it names in `retune`. A stopped tuning continues in its folder,
    outputs/<study>/v<N>/tuning/<pipeline>/<arm>."""
    from horst_sparse.study import protocol as protocols

    earlier = protocols.tuned_under(protocol, versions) if versions else protocol
    budget = protocol.tuning
    lines = []
    for pipeline, group in itertools.groupby(sorted(jobs, key=lambda j: j.pipeline), key=lambda j: j.pipeline):
        group = list(group)
        recipe = group[0].recipe
        for arm in sorted({j.config["tuned_as"] for j in group}):
            record = (group[0].config["tuned"].get(arm) or {}).get("provenance") or {}
            made = (record.get("protocol") or {}).get("version")
            if earlier is not protocol and (pipeline, arm) not in protocol.retuned:
                if made != earlier.version:
                    raise StudyError(
                        f"{protocol.path.name} runs {pipeline} {arm} at v{earlier.version}'s pick, but "
                        f"configs/tuned/ holds none of v{earlier.version}'s: restore it (git log -- configs/tuned)"
                    )
                continue
            if made == protocol.version:
                continue
            folder = Path("outputs") / protocol.study / f"v{protocol.version}" / "tuning" / pipeline / arm
            lines.append(
                [
                    "python",
                    "scripts/tune.py",
                    pipeline,
                    arm,
                    "--trials",
                    str(budget["trials"][pipeline]),
                    "--top-k",
                    str(budget["top_k"][pipeline]),
                    "--rerun-seeds",
                    str(budget["rerun_seeds"]),
                    "--protocol",
                    str(protocol.path.relative_to(REPO)),
                    "--sweep-dir",
                    str(folder),
                    f"{get_pipeline(pipeline).recipe_group}={recipe}",
                    *budget["overrides"],
                ]
            )
    return lines


def picks(jobs: Sequence[Job]) -> set[tuple[int | None, str]]:
    """(protocol version, commit) of each pick the jobs run at (scripts/tune.py's provenance)."""
    made = [(job.config["tuned"].get(job.config["tuned_as"]) or {}).get("provenance") or {} for job in jobs]
    return {((p.get("protocol") or {}).get("version"), p["commit"]) for p in made if p.get("commit")}


def check_protocol(current: Any, versions: Sequence[Any], rows: pd.DataFrame, jobs: Sequence[Job]) -> None:
    """Before new tunings and runs: the files of the current version, and of the version whose
    tunings it takes, are as their registrations left them, in the working tree and at every
    commit their rows and picks were made at (protocol.check_unchanged)."""
    from horst_sparse.study import protocol as protocols

    reviewed = protocols.reviewed(versions)
    made = picks(jobs)
    earlier = protocols.tuned_under(current, versions)
    protocols.check_unchanged(
        current, [None, *rows.git_commit.dropna(), *(c for v, c in made if v == current.version)], reviewed
    )
    if earlier is not current:
        protocols.check_unchanged(earlier, [None, *(c for v, c in made if v == earlier.version)], reviewed)


def run_tunings(lines: Sequence[list[str]]) -> None:
    """Run the tunings one after another, then stop: the study's runs start from a commit that
    holds the picks."""
    env = _subprocess_env()
    for line in lines:
        print(f"$ {shlex.join(line)}", flush=True)
        if subprocess.call([sys.executable, *line[1:]], cwd=REPO, env=env):
            raise StudyError(f"the tuning `{shlex.join(line)}` failed (see above); fix it and run the study again")
    raise StudyError(
        f"{len(lines)} arm(s) tuned: commit the picks (git add configs/tuned results/tuning && git commit), "
        "then run the study again; its runs must come from a commit that holds them"
    )


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
    from horst_sparse.study import protocol as protocols

    out = Path(out or REPO / "results" / study)
    try:
        versions = protocols.versions(study)
    except protocols.ProtocolError:
        versions = []  # the demo: no comparison, no protocol
    current = versions[-1] if versions else None
    if current is not None and not current.runnable:
        raise StudyError(f"{current.path.relative_to(REPO)} names no presets: the study has no version to run")
    presets = presets_of(study)
    chosen = [p for p in presets if pipelines is None or pipeline_of(p).name in pipelines]
    # The command line's overrides are for the pipelines it runs; another pipeline's presets are
    # composed as they stand (a ViT key such as acdc.sparsity does not exist in GPT-2's config).
    every = study_jobs(chosen, extra) + study_jobs([p for p in presets if p not in chosen])
    jobs = [j for j in every if j.preset in chosen]
    record = out / "runs.csv"
    earlier = read_record([record]) if record.is_file() else pd.DataFrame(columns=RECORD_COLUMNS)
    version = None if current is None else current.version
    if current is not None and not report_only:
        mine = (
            earlier[earlier.get("protocol", pd.Series(dtype=float)) == version]
            if "protocol" in earlier
            else earlier[:0]
        )
        check_protocol(current, versions, mine, jobs)
        missing = tunings(current, jobs, versions)
        if missing:
            run_tunings(missing)
        check_budgets(jobs, current.declared_edges)
    frame, folders = runs_of(every, record, version)
    problems = stale(every, frame, folders)
    if problems:
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
        # the pipelines at the picks they read). A report adds no run: the record's numbers stand,
        # each with its commit, whatever the code has become since.
        check_provenance(
            [*frame.git_commit.dropna().unique(), *(c for _, c in (picks(every) if current else ()))],
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
    split = {_preset(j.preset).get("eval_split", "validation") for j in every}.pop()
    source = str(record.relative_to(REPO) if record.is_relative_to(REPO) else record)
    intro = readme(study, frame, every, extra, split, out, current)
    if versions:
        write_versions_report(frame, out, versions, split=split, folders=folders, source=source, intro=intro)
    else:
        write_report(frame, out, split=split, folders=folders, source=source, intro=intro)
    mine = frame if current is None else frame[frame["protocol"] == current.version]
    missing = len(jobs) - mine.run.isin({j.run for j in jobs}).sum()
    return status or int(missing > 0)


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
    study's claims.md, headline.md and README.md holding every version's verdicts, each labelled."""
    from horst_sparse.analysis import claims, report

    claims_parts, headlines = [], []
    for protocol in reversed(versions):  # the newest first
        rows = frame[frame["protocol"] == protocol.version]
        if rows.empty:
            continue
        rules = claims.load_rules(protocol.claims)
        rules["source"] = str(protocol.claims.relative_to(REPO))
        folder = out / f"v{protocol.version}"
        legend = f"Protocol {protocol.label} ({protocol.path.relative_to(REPO)}): {protocol.why}"
        text = report.write_report(
            rows,
            folder,
            rules=rules,
            split=split,
            folders=folders,
            source=f"{source}, protocol {protocol.version}",
            intro=f"# The {protocol.study} study, protocol {protocol.label}\n\n{legend}\n",
        )
        claims_parts.append(f"# Protocol {protocol.label}\n\n{legend}\n\n{text}")
        body = (folder / "headline.md").read_text().split("\n", 1)[1].rsplit(report.HEADLINE_END, 1)[0].strip()
        headlines.append(
            f"**Protocol {protocol.label}** ({protocol.path.relative_to(REPO)}; v{protocol.version}/):\n\n{body}"
        )
    (out / "claims.md").write_text("\n\n".join(claims_parts))
    headline = "\n".join([report.HEADLINE_START, "", "\n\n".join(headlines), "", report.HEADLINE_END]) + "\n"
    (out / "headline.md").write_text(headline)
    (out / "README.md").write_text(intro + "\n" + headline)


def main(argv: Sequence[str] | None = None) -> None:
    """`horst-study` (scripts/embedded_study.py): the embedded study, the demo, their reports and checks.

        horst-study                             # make study: results/embedded/
        horst-study --demo                      # make demo (<= 15 min on 2 cores): trains into outputs/demo/,
                                                # then compares with the committed results/demo/
        horst-study --demo --out results/demo   # make demo-reference: the committed reference
        horst-study --report-only               # no runs: the report of the runs done
        horst-study --check                     # make check-results: rerun one cell per pipeline, judged
                                                # bit for bit or against its seeds' spread (study/check.py)
        horst-study hydra/launcher=slurm        # extra overrides go to every multirun

    Refuses a dirty tree, arms not tuned alike (the embedded study), new runs beside runs of
    other code, and finished runs whose config is not what the presets now compose (stale)."""
    import argparse

    from horst_sparse.pipeline import names
    from horst_sparse.study.protocol import ProtocolError
    from horst_sparse.training.config import RunError

    parser = argparse.ArgumentParser(
        prog="horst-study",
        description=(main.__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(main.__doc__ or "").split("\n\n", 1)[1],
    )
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
        if not args.report_only:
            check_clean()
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
