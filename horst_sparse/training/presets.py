"""Which presets of the shared `configs/` tree belong to which pipeline, for `--help` and for
a one-line error when a command names another pipeline's preset.

The entry points share one config tree (optimizers, launchers and studies are common), so
Hydra alone would offer `train_gpt2.py model=deit_small` and fail deep in composition. A
model belongs to the pipeline its `arch` names; an experiment or a study preset to
the pipeline its `pipeline:` key names (one without the key, an arm or a sweep of shared keys, to every
pipeline); a recipe group to its pipeline (`Pipeline.recipe_group`). The pipelines are the
registry's (horst_sparse.pipeline): this module names none.

`misspelt_key` checks a command line's keys against the pipeline's schema before Hydra
composes anything, so a misspelt key gets "did you mean" first (Hydra's own message would
suggest appending it with `+`).
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import typing
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from horst_sparse import pipeline as registry
from horst_sparse.paths import CONFIGS


def _names(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def _owner(path: Path) -> str | None:
    """The `pipeline:` a preset file names (None: it serves every pipeline)."""
    return OmegaConf.load(path).get("pipeline")


def presets(name: str) -> dict[str, list[str]]:
    """`{group: options}` of the pipeline called `name`."""
    pipeline = registry.get(name)
    return {
        "model": [m for m in _names("model") if OmegaConf.load(CONFIGS / "model" / f"{m}.yaml").get("arch") == name],
        "experiment": [e for e in _names("experiment") if _owner(CONFIGS / "experiment" / f"{e}.yaml") in (None, name)],
        pipeline.recipe_group: _names(pipeline.recipe_group),
        "optimizer": _names("optimizer"),
        "+study": [s for s in _names("study") if _owner(CONFIGS / "study" / f"{s}.yaml") in (None, name)],
        "hydra/launcher": _names("hydra/launcher"),
    }


def register_help(name: str, description: str) -> None:
    """`--help` of the entry point: its own presets, then the composed config."""
    script = registry.get(name).script
    choices = "\n".join(f"  {group}: {', '.join(options)}" for group, options in presets(name).items())
    template = (
        f"{script}: {description}\n\n== Presets of this pipeline (group=option) ==\n{choices}\n\n"
        "== Config ==\nOverride anything in the config (foo.bar=value); the README explains each setting.\n\n$CONFIG\n"
    )
    ConfigStore.instance().store(
        group="hydra/help", name=name, node={"app_name": script, "header": "", "footer": "", "template": template}
    )


def _schema(name: str) -> type:
    """The dataclass of a schema the pipeline stored in Hydra's ConfigStore (`register_configs`)."""
    return OmegaConf.get_type(ConfigStore.instance().load(f"{name}.yaml").node)


def misspelt_key(pipeline: str, overrides: list[str]) -> str | None:
    """ "KEY is not a setting; did you mean ...?" for the first override whose key the
    pipeline's schema does not have, else None. Keys added with `+`, Hydra's own, config
    groups and what the schema leaves open (the optimizer's keys, which its class checks)
    are not judged here."""
    groups = {p.name for p in CONFIGS.iterdir() if p.is_dir()}
    for override in overrides:
        key = override.partition("=")[0]
        if not key or key.startswith(("+", "hydra.", "hydra/")) or "/" in key or "@" in key:
            continue
        parts = key.lstrip("~").split(".")
        if parts[0] in groups and len(parts) == 1:
            continue
        schema = _schema(registry.get(pipeline).run_schema)
        for depth, part in enumerate(parts):
            fields = typing.get_type_hints(schema)
            if part not in fields:
                known = list(fields) + (sorted(groups) if depth == 0 else [])
                prefix = ".".join(parts[:depth] + [""])
                close = difflib.get_close_matches(part, known, n=1)
                hint = (
                    f"did you mean {prefix}{close[0]}?"
                    if close
                    else f"{prefix.rstrip('.') or 'the config'} has {', '.join(fields)}"
                )
                return f"{key} is not a setting; {hint}"
            kind = fields[part]
            if depth == 0 and part == "model":
                kind = _schema(registry.get(pipeline).model_schema)
            if not dataclasses.is_dataclass(kind):
                break  # a value, or a section the schema leaves open
            schema = kind
    return None


def group_options(group: str) -> list[str] | None:
    """The options of a config group (`optimizer`, `hydra/launcher`, `sweep`, ...): its YAML files and
    what Hydra's plugins and the pipelines stored in Hydra's ConfigStore; None where `group` is no group."""
    from hydra.core.plugins import Plugins

    Plugins.instance()  # imports Hydra's plugins, which store their options (joblib, optuna, ...)
    folder = CONFIGS / group
    files = {p.stem for p in folder.glob("*.yaml")} if folder.is_dir() else set()
    try:
        stored = {n.removesuffix(".yaml") for n in ConfigStore.instance().list(group) if n.endswith(".yaml")}
    except OSError:  # ConfigStore's "Path not found": not a group it holds
        stored = set()
    return sorted(files | stored) if folder.is_dir() or stored else None


def unknown_option(overrides: list[str]) -> str | None:
    """ "GROUP=OPTION is not a GROUP option; did you mean ...?" for the first override that names
    an option its config group does not have (one line, before Hydra's multi-line dump), else None.
    Sweep syntax (`choice(...)`, ranges), interpolations and null are left to Hydra."""
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if not value or "." in key or key.startswith("hydra") and "/" not in key:
            continue
        options = group_options(key)
        if options is None:
            continue
        for option in value.split(","):
            if option in options or option == "null" or any(c in option for c in "()[]${}"):
                continue
            typed = override.partition("=")[0]
            close = difflib.get_close_matches(option, options, n=1)
            hint = f"did you mean {typed}={close[0]}? " if close else ""
            return f"{typed}={option}: {key} has no option {option}; {hint}({key}: {', '.join(options)})"
    return None


def check_command_line(pipeline: str, argv: list[str]) -> None:
    """Stop with one line if `argv` picks another pipeline's model or experiment, names a key the
    pipeline does not have, or an option a config group does not have."""
    overrides = [a for a in argv if not a.startswith("-") and ("=" in a or a.startswith("~"))]
    problem = misspelt_key(pipeline, overrides) or unknown_option(overrides)
    if problem:
        sys.exit(f"error: {problem}")
    own = presets(pipeline)
    for argument in argv:
        key, _, value = argument.lstrip("+~").partition("=")
        if key in ("model", "experiment") and value:
            for option in value.split(","):
                if option in _names(key) and option not in own[key]:
                    owner = next(p for p in registry.names() if option in presets(p)[key])
                    sys.exit(
                        f"error: {key}={option} is a preset of {registry.get(owner).script}; {registry.get(pipeline).script} takes "
                        f"{key}={' | '.join(own[key]) or '(none)'}"
                    )
