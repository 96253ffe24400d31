"""A pipeline as one object, and the one registry that looks it up by name.

Each pipeline package declares one `Pipeline` (`horst_sparse.vit.pipeline.PIPELINE`,
`horst_sparse.gpt2.pipeline.PIPELINE`): its name (the `pipeline:` key of its configs; its config
files and entry point follow from it), its task, its config schemas, its start-up checks, the
numbers its runs record, the score its tunings maximise or minimise, and its export. Code that serves every pipeline (planning, tuning, the
study, the SLURM launcher, the exports) takes the pipeline from a config's `pipeline` key and
asks the registry for it; it never names one.

The registry is the `horst_sparse.pipelines` entry-point group (pyproject.toml; another package
adds a pipeline by declaring its own entry point) plus what `register` adds in this process.
Looking a name up imports that pipeline only; importing this module imports none (timm's
`_optim_factory` registry, for pipelines).
"""

from __future__ import annotations

import difflib
import importlib.metadata
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

GROUP = "horst_sparse.pipelines"


@dataclass(frozen=True)
class TuningScore:
    """What a tuning trial returns to the sweeper: `score(summary)` of a finished run measured on
    the validation split (a non-finite or missing value counts as the worst)."""

    description: str
    direction: str  # maximize | minimize
    score: Callable[[Mapping[str, Any]], float]

    def worst(self) -> float:
        return -math.inf if self.direction == "maximize" else math.inf


@dataclass(frozen=True)
class Configs:
    """A pipeline's configs as code sees them: `register()` stores its schemas in Hydra's ConfigStore
    (the values are in YAML); `lr_key` is the key of its learning rate (`train.base_lr`), the setting
    a non-finite loss or a misplaced `optimizer.lr` is pointed to."""

    register: Callable[[], None]
    lr_key: str


@dataclass(frozen=True)
class Checks:
    """What a run checks before it starts, a ConfigError each: `config(cfg, world_size=...)` the values,
    `data(cfg)` that the data exist where the config says (generated data: nothing to check). The
    planner makes both before anything is submitted."""

    config: Callable[..., None]
    data: Callable[[Any], None] = lambda cfg: None


@dataclass(frozen=True)
class Export:
    """`run(run_folder, out, **options) -> facts` writes a finished run in `format` (`--to` of the
    export command: hf, timm)."""

    run: Callable[..., dict]
    format: str


@dataclass(frozen=True)
class Pipeline:
    """One pipeline, one concern a field. The rest follows from `name` by one convention: the
    primary config `configs/train_<name>.yaml` with the entry point `train_<name>.py` beside
    configs/, the recipe group `<name>_recipe` (whose choice picks its tuned values in
    `configs/tuned/<name>/<recipe>.yaml`), and the schemas `schema_<name>_run` and `model/schema_<name>` in
    Hydra's ConfigStore."""

    name: str  # the `pipeline:` key of its primary config and of every preset that is its own
    run: Callable[..., dict]  # run(cfg, *, run_dir) -> summary: the task
    configs: Configs
    checks: Checks
    # numbers(config, summary) -> the run's results as tidy rows (metric, method, pattern, sparsity,
    # value), written into summary.json, and with summary None (value None) into a failed run's
    # failed.json: the results layer reads them without knowing the pipeline
    numbers: Callable[[Mapping[str, Any], Mapping[str, Any] | None], list[dict[str, Any]]]
    tuning: TuningScore
    export: Export | None = None

    @property
    def config_name(self) -> str:
        return f"train_{self.name}"

    @property
    def script(self) -> str:
        return f"train_{self.name}.py"

    @property
    def recipe_group(self) -> str:
        return f"{self.name}_recipe"

    @property
    def run_schema(self) -> str:
        return f"schema_{self.name}_run"

    @property
    def model_schema(self) -> str:
        return f"model/schema_{self.name}"


_ADDED: dict[str, Pipeline] = {}


class UnknownPipeline(LookupError):
    pass


def register(pipeline: Pipeline) -> Pipeline:
    """Add a pipeline in this process (a notebook's, a test's); installed ones come by entry point."""
    _ADDED[pipeline.name] = pipeline
    return pipeline


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {e.name: e for e in importlib.metadata.entry_points(group=GROUP)}


def names() -> list[str]:
    """Every pipeline's name, importing none."""
    return sorted({*_entry_points(), *_ADDED})


def get(name: str) -> Pipeline:
    """The pipeline called `name`; an UnknownPipeline naming the closest one otherwise."""
    if name in _ADDED:
        return _ADDED[name]
    entry = _entry_points().get(name)
    if entry is None:
        close = difflib.get_close_matches(str(name), names(), n=1)
        hint = f"did you mean {close[0]}?" if close else f"the pipelines are {', '.join(names())}"
        raise UnknownPipeline(f"no pipeline {name!r}; {hint}")
    pipeline = entry.load()
    if pipeline.name != name:
        raise UnknownPipeline(f"entry point {name} of {GROUP} loads the pipeline {pipeline.name!r}")
    return pipeline


def every() -> list[Pipeline]:
    return [get(name) for name in names()]


def by_script(script: str) -> Pipeline:
    """The pipeline whose entry point is `script` (a path: its file name counts)."""
    from pathlib import Path

    found = [p for p in every() if p.script == Path(script).name]
    if not found:
        raise UnknownPipeline(f"{script} is no pipeline's entry point; they are {', '.join(p.script for p in every())}")
    return found[0]


def of(config: Mapping[str, Any]) -> Pipeline:
    """The pipeline a composed config belongs to (its `pipeline` key)."""
    name = config.get("pipeline")
    if not name:
        raise UnknownPipeline("the config has no `pipeline` key: is it composed from a pipeline's primary config?")
    return get(str(name))
