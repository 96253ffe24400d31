"""Hydra composition from code, written once: a pipeline's config as its entry point composes it,
and a multirun's command line expanded into its jobs as Hydra's basic sweeper expands it.

Planning (`horst_sparse.plan`), tuning, the study, the benchmarks and the tests' fixtures
compose through here, with Hydra's public API (`initialize_config_dir`, `compose`,
`OverridesParser`, `Override.sweep_string_iterator`) and the entry points' `version_base`.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from horst_sparse.paths import CONFIGS
from horst_sparse.pipeline import Pipeline

VERSION_BASE = "1.3"  # the entry points' @hydra.main(version_base=...)


class ComposeError(RuntimeError):
    """A command line that does not compose; the message is one line."""


def one_line(error: BaseException) -> str:
    """Hydra's and OmegaConf's multi-line messages as one line."""
    text = str(error).split("\nConfig search path:")[0]  # Hydra's list of its search path says nothing here
    line, listing = "", False
    for part in (p.strip() for p in text.splitlines() if p.strip()):
        line += (", " if listing and not part.endswith(":") else "; " if line else "") + part
        listing = listing or part.endswith(":")
    return line.replace(":, ", ": ") or type(error).__name__


@contextlib.contextmanager
def hydra_context(config_dir: Path = CONFIGS, job_name: str = "compose") -> Iterator[None]:
    """Hydra initialised on `config_dir` for this block, and cleared after (one composition
    context at a time, as Hydra allows)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=VERSION_BASE, job_name=job_name):
            yield
    finally:
        GlobalHydra.instance().clear()


def compose_in_context(pipeline: Pipeline, overrides: Sequence[str], *, hydra_node: bool = True) -> Any:
    """The pipeline's config with `overrides`, inside a `hydra_context`; a ComposeError in one line."""
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return compose(config_name=pipeline.config_name, overrides=list(overrides), return_hydra_config=hydra_node)
    except (HydraException, OmegaConfBaseException) as error:
        raise ComposeError(one_line(error)) from None


def compose(
    pipeline: Pipeline, overrides: Sequence[str] = (), *, config_dir: Path = CONFIGS, hydra_node: bool = False
) -> Any:
    """The pipeline's config (a DictConfig) as `python <its script> <overrides>` composes it."""
    pipeline.configs.register()
    with hydra_context(config_dir):
        return compose_in_context(pipeline, overrides, hydra_node=hydra_node)


def sweep_jobs(arguments: Sequence[str], *, config_loader: Any = None) -> list[list[str]]:
    """The jobs of a multirun's task overrides, as Hydra's basic sweeper makes them: one list of
    `key=value` per job, the product of every override's values; a key given twice takes its
    last value (so the command line wins over a sweep preset's params)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(list(arguments))
    except HydraException as error:
        raise ComposeError(one_line(error)) from None
    values: dict[str, list[str]] = {}
    for override in parsed:
        key = override.get_key_element()
        if not override.is_sweep_override():
            values[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            values[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            raise ComposeError(
                f"{override.input_line}: Hydra's basic sweeper sweeps lists, not {override.value_type.name}"
            )
    return [list(job) for job in itertools.product(*values.values())]


def expand(
    pipeline: Pipeline, overrides: Sequence[str], *, config_dir: Path = CONFIGS
) -> tuple[Any, list[tuple[list[str], Any]]]:
    """(the multirun's base config, its jobs as (sweep overrides, composed config)): every job
    composed as Hydra's multirun composes it, `hydra.job.num` and `hydra.job.id` set.

    The base config is the command line without its sweeps; it gives the sweep preset's
    `hydra.sweeper.params` and the launcher. A job that does not compose is a ComposeError
    naming it."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import open_dict

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as error:
        raise ComposeError(one_line(error)) from None
    for override in parsed:
        if override.is_hydra_override() and override.is_sweep_override():
            raise ComposeError(f"{override.input_line}: Hydra does not sweep over its own configuration")
    hydra_overrides = [o.input_line for o in parsed if o.is_hydra_override()]
    task_overrides = [o.input_line for o in parsed if not o.is_hydra_override()]
    pipeline.configs.register()
    with hydra_context(config_dir, job_name="plan"):
        base = compose_in_context(pipeline, [o.input_line for o in parsed if not o.is_sweep_override()])
        sweeper = base.hydra.sweeper
        if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
            raise ComposeError(f"only Hydra's basic sweeper is expanded here; this multirun uses {sweeper._target_}")
        params = [f"{key}={value}" for key, value in (sweeper.get("params") or {}).items()]
        jobs = sweep_jobs(params + task_overrides, config_loader=GlobalHydra.instance().config_loader())
        composed = []
        for num, job in enumerate(jobs):
            try:
                config = compose_in_context(pipeline, hydra_overrides + job)
            except ComposeError as error:
                raise ComposeError(f"cell {num} ({' '.join(job)}) does not compose: {error}") from None
            with open_dict(config):  # what Hydra's multirun sets in each job's config
                config.hydra.job.num = num
                config.hydra.job.id = f"plan_{num}"
            composed.append((job, config))
    return base, composed


COMMAND_LINE = "the command line"
_INTERPOLATION = re.compile(r"\$\{([^${}]+)\}")  # an innermost ${...}


def where_from(pipeline: Pipeline, overrides: Sequence[str] = (), *, config_dir: Path = CONFIGS) -> list[tuple]:
    """Every value of the pipeline's config with `overrides`, and where it comes from: rows
    (key, value, source, via). `source` is the file under configs/ that set the value last in the
    defaults list's order (Hydra's merge order), or the command line; a value that interpolates
    another key (`${hparams.base_lr}`, through `hparams: ${tuned.${tuned_as}}` to `tuned.horst.base_lr`)
    takes the source of the key it resolves to, and `via` names the file and the interpolation that
    sent it there, and the key it reached ('' for a plain value)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    pipeline.configs.register()
    with hydra_context(config_dir):
        composed = compose_in_context(pipeline, overrides, hydra_node=False)
        loader = GlobalHydra.instance().config_loader()
        defaults = loader.compute_defaults_list(pipeline.config_name, list(overrides), RunMode.RUN)
        set_by: dict[str, str] = {}
        for default in defaults.defaults:
            if default.config_path.startswith("hydra/") or default.package.startswith("hydra"):
                continue
            loaded = loader.repository.load_config(default.config_path)
            node = OmegaConf.to_container(loaded.config, resolve=False)
            node.pop("defaults", None)
            node.pop("hydra", None)
            prefix = f"{default.package}." if default.package else ""
            source = f"the schema {default.config_path}" if loaded.is_schema_source else f"{default.config_path}.yaml"
            for key in _leaves(node):
                if _raw(node, key) != "???":  # a schema's MISSING: a file must give the value
                    set_by[prefix + key] = source
        for override in OverridesParser.create().parse_overrides(list(overrides)):
            key = override.key_or_group
            if not override.is_hydra_override() and not loader.repository.group_exists(key):  # a value, not an option
                for leaf in [k for k in set_by if k == key or k.startswith(key + ".")] or [key]:
                    set_by[leaf] = COMMAND_LINE
    raw = OmegaConf.to_container(composed, resolve=False)
    rows = []
    for key in _leaves(raw):
        value = OmegaConf.select(composed, key, throw_on_resolution_failure=False)
        at, text, via = key, _raw(raw, key), ""
        while isinstance(text, str) and "${" in text:  # follow the interpolation to the key it copies
            via = via or f"{set_by.get(key, '?')}: {text}"
            target = _reference(composed, text, at=at)
            if target is None or target == at:  # a resolver's result, not another key's value
                at = None
                break
            at = _through_nodes(composed, raw, target)
            text = _raw(raw, at)
        if via and at is not None:
            via += f" -> {at}"
        rows.append((key, value, "computed" if at is None else _set_by(set_by, at), via))
    return rows


def _through_nodes(composed: Any, raw: Any, key: str) -> str:
    """`key` with every section on its way that interpolates another (`hparams: ${tuned.${tuned_as}}`,
    `lion: ${.adamw}`) replaced by the section it copies: the key that holds the value."""
    parts = key.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        text = _raw(raw, prefix)
        if isinstance(text, str) and "${" in text:
            target = _reference(composed, text, at=prefix)
            return key if target is None else _through_nodes(composed, raw, ".".join([target, *parts[i:]]))
    return key


def _set_by(set_by: dict[str, str], key: str) -> str:
    """Where `key` was set last; for a whole section (`${.adamw}` copies one), where its values were."""
    if key in set_by:
        return set_by[key]
    return " and ".join(sorted({source for k, source in set_by.items() if k.startswith(key + ".")})) or "?"


def _leaves(node: Any, prefix: str = "") -> Iterator[str]:
    """The dotted keys of a nested dict's values (a list is one value)."""
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def _raw(raw: Any, key: str) -> Any:
    for part in key.split("."):
        raw = raw.get(part) if isinstance(raw, dict) else None
    return raw


def _reference(composed: Any, text: str, *, at: str) -> str | None:
    """The absolute key that the interpolation `text` of the key `at` copies, once its inner
    interpolations are resolved; None for a resolver's call or a value built around interpolations."""
    from omegaconf import OmegaConf

    while True:
        inner = list(_INTERPOLATION.finditer(text))
        if not inner or ":" in inner[0].group(1):
            return None
        key = _absolute(inner[0].group(1), at)
        if len(inner) == 1 and inner[0].span() == (0, len(text)):
            return key
        value = OmegaConf.select(composed, key, throw_on_resolution_failure=False)
        text = text[: inner[0].start()] + str(value) + text[inner[0].end() :]


def _absolute(reference: str, at: str) -> str:
    """`${.x}` is a sibling of the key `at`, `${..x}` its parent's sibling (OmegaConf's relative keys)."""
    dots = len(reference) - len(reference.lstrip("."))
    if not dots:
        return reference
    parent = at.split(".")[:-dots]
    return ".".join([*parent, reference[dots:]])


def where_from_text(rows: list[tuple]) -> str:
    """The rows of `where_from` as aligned lines: key, value, source (and the interpolation that led there)."""
    width = max(len(key) for key, *_ in rows)
    shown = [
        (key, repr(value) if isinstance(value, str) else str(value), source, via) for key, value, source, via in rows
    ]
    value_width = min(30, max(len(v) for _, v, _, _ in shown))
    return "\n".join(
        f"{key:<{width}}  {value:<{value_width}}  {source}" + (f"  (via {via})" if via else "")
        for key, value, source, via in shown
    )
