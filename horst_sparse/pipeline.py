"""A pipeline as one object, and the one registry that looks it up by name.

Each pipeline package declares one `Pipeline` (`horst_sparse.vit.pipeline.PIPELINE`,
`horst_sparse.gpt2.pipeline.PIPELINE`): its name (the `pipeline:` key of its configs), its primary
config and entry point, its task, its config schemas and start-up checks, the score its tunings
maximise or minimise, and its export. Code that serves every pipeline (planning, tuning, the
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
class Pipeline:
    name: str  # the `pipeline:` key of its primary config and presets; its folder under configs/tuned/
    config_name: str  # its primary config in configs/ (`train_vit`)
    script: str  # its entry point beside configs/ (`train_vit.py`)
    run: Callable[..., dict]  # run(cfg, *, run_dir) -> summary: the task
    register_configs: Callable[[], None]  # stores its schemas in Hydra's ConfigStore
    validate: Callable[..., None]  # validate(cfg, *, world_size): the start-up checks, a ConfigError each
    check_data: Callable[[Any], None]  # check_data(cfg): the data exist where the config says
    # numbers(config, summary) -> the run's results as tidy rows (metric, method, pattern, sparsity,
    # value), written into summary.json, and with summary None (value None) into a failed run's
    # failed.json: the results layer reads them without knowing the pipeline
    numbers: Callable[[Mapping[str, Any], Mapping[str, Any] | None], list[dict[str, Any]]]
    tuning: TuningScore
    export: Callable[..., dict] | None  # export(run_folder, out, **options) -> facts; None: no export
    export_format: str | None  # `--to` of the export command (hf, timm)
    recipe_group: (
        str  # its config group of recipes (`vit_recipe`), which picks its tuned values (configs/tuned/<name>/)
    )
    run_schema: str  # the name of its run config's schema in Hydra's ConfigStore (`schema_vit_run`)
    model_schema: str  # its model schema's (`model/schema_vit`)
    lr_key: str  # the config key of its learning rate (`train.base_lr`)


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
