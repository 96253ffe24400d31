"""A study's jobs: every job of its presets (`configs/study/<study>_<pipeline>.yaml`), composed as
Hydra composes it, with its run folder (its id in the record) and the signature of its config; the
runs done of them, the stale ones, and the multiruns that run the rest."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from horst_sparse.analysis.runs import RECORD_COLUMNS, UNRECORDED, read_record, scan, signature, signature_hash
from horst_sparse.compose import compose_in_context, hydra_context, sweep_jobs
from horst_sparse.paths import CONFIGS, REPO
from horst_sparse.pipeline import Pipeline
from horst_sparse.pipeline import get as get_pipeline


class StudyError(RuntimeError):
    pass


@dataclass(frozen=True)
class Job:
    pipeline: str
    preset: str
    # the job's sweep overrides without the seed, e.g. ("experiment=horst", "acdc.sparsity=0.9")
    overrides: tuple[str, ...]
    seed: int
    run: str  # its folder, relative to the repository: the run's id in the record
    sweep_dir: str
    signature: str
    config: dict  # the composed job config (hydra node aside), for naming what a stale run differs in
    recipe: str  # the pipeline's recipe (<pipeline>_recipe), which its tuning runs on

    def provenance(self, arm: str | None = None) -> dict[str, Any]:
        """How the values the job reads for `arm` (its own `tuned_as`) were tuned; {} where they were not."""
        return (self.config["tuned"].get(arm or self.config["tuned_as"]) or {}).get("provenance") or {}


def by_pipeline(jobs: Sequence[Job]) -> dict[str, list[Job]]:
    return {
        p: list(group) for p, group in itertools.groupby(sorted(jobs, key=lambda j: j.pipeline), lambda j: j.pipeline)
    }


def preset_config(name: str, configs: Path = CONFIGS) -> dict[str, Any]:
    """A preset's YAML, over the presets its defaults list names (`- embedded_vit`: a sibling in
    configs/study/), merged as Hydra merges them."""
    from omegaconf import OmegaConf

    path = configs / "study" / f"{name}.yaml"
    if not path.is_file():
        raise StudyError(f"no study preset {path}")
    own = yaml.safe_load(path.read_text())
    bases = [
        preset_config(entry, configs)
        for entry in own.get("defaults", [])
        if isinstance(entry, str) and entry != "_self_"
    ]
    return OmegaConf.to_container(OmegaConf.merge(*bases, own)) if bases else own


def pipeline_of(preset: str, configs: Path = CONFIGS) -> Pipeline:
    """The pipeline a study preset says it belongs to (its `pipeline:` key, or its base's)."""
    name = preset_config(preset, configs).get("pipeline")
    if not name:
        raise StudyError(f"configs/study/{preset}.yaml has no `pipeline:` key: say which pipeline it runs")
    return get_pipeline(name)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _params(preset: str, extra: Sequence[str], configs: Path) -> dict[str, Any]:
    """The preset's sweep with the command line's overrides of its keys in place, as Hydra merges them."""
    params = preset_config(preset, configs)["hydra"]["sweeper"]["params"]
    replaced = {_key(o): o.split("=", 1) for o in extra}
    return dict(replaced.get(_key(key), (key, value)) for key, value in params.items())


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


def study_jobs(presets: Sequence[str], extra: Sequence[str] = (), *, configs: Path = CONFIGS) -> list[Job]:
    """Every job of the presets (configs/study/), composed from `configs`. A job's seed is not in
    its signature, so each cell is composed once and its seeds set on the composed config."""
    from hydra.core.hydra_config import HydraConfig

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
                recipe, sweep = config.hydra.runtime.choices[pipeline.recipe_group], config.hydra.sweep
                for seed, job in zip(seeds, _resolved(config, seeds)):
                    run, folder = str(Path(sweep.dir) / str(sweep.subdir)), str(sweep.dir)  # at `seed`
                    jobs.append(
                        Job(pipeline.name, preset, overrides, seed, run, folder, signature_hash(job), job, recipe)
                    )
        HydraConfig.instance().cfg = None  # set only to resolve the sweep folder: no job of this process runs
    return jobs


def _resolved(config: Any, seeds: Sequence[int]) -> Iterator[dict]:
    """The cell's job (its resolved config, the hydra node aside) at each seed, yielded with
    `config.seed` set to it. Resolving is the slow part (OmegaConf parses every interpolation): the
    first two seeds are resolved whole, and at every other seed only the keys in which those two
    differ are resolved again (the seed, and whatever interpolates it). The jobs share the rest:
    a job's config is read, never written."""
    from omegaconf import Container, OmegaConf, open_dict

    def whole(seed: int) -> dict:
        with open_dict(config):
            config.seed = seed
        job = OmegaConf.to_container(config, resolve=True)
        del job["hydra"]
        return job

    first = whole(seeds[0])
    yield first
    if len(seeds) == 1:
        return
    second = whole(seeds[1])
    varying = _differing(first, second)
    yield second
    for seed in seeds[2:]:
        with open_dict(config):
            config.seed = seed
        job = dict(first)  # the first seed's dicts, copied only along the paths that differ
        for path in varying:
            node, parent = config, job
            for key in path:
                node = node[key]
            for key in path[:-1]:
                parent[key] = dict(parent[key])
                parent = parent[key]
            parent[path[-1]] = OmegaConf.to_container(node, resolve=True) if isinstance(node, Container) else node
        yield job


def _differing(a: Any, b: Any, path: tuple = ()) -> list[tuple]:
    """The paths (keys from the root) at which two resolved configs differ, as deep as both are
    mappings with the same keys."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return [p for key in a for p in _differing(a[key], b[key], (*path, key))]
    return [] if a == b else [path]


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
