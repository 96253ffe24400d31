"""Which presets of the shared `configs/` tree belong to which pipeline, for `--help` and for
a one-line error when a command names another pipeline's preset.

The two entry points share one config tree (optimizers, launchers and sweeps are common), so
Hydra alone would offer `train_gpt2.py model=deit_small` and fail deep in composition. A
model belongs to the pipeline its `arch` names; an experiment to the pipeline of the model
it selects; a recipe group (`gpt2_recipe`, `vit_recipe`) to its pipeline; a sweep to both
unless it sets another pipeline's keys or presets.

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

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PIPELINES = {"gpt2": "train_gpt2.py", "vit": "train_vit.py"}
OWN_KEYS = {"gpt2": ("prune.", "export.", "eval."), "vit": ("acdc.", "aug.", "vit_recipe")}


def _names(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def _selected(path: Path, group: str) -> str | None:
    """The option of `group` that a preset file selects in its defaults list, if any."""
    for entry in OmegaConf.load(path).get("defaults", []) or []:
        if isinstance(entry, dict) or OmegaConf.is_dict(entry):
            for key, value in entry.items():
                if key.split()[-1].lstrip("/") == group:
                    return value
    return None


def presets(pipeline: str) -> dict[str, list[str]]:
    """`{group: options}` of `pipeline` (gpt2 | vit)."""
    models = [m for m in _names("model") if OmegaConf.load(CONFIGS / "model" / f"{m}.yaml").get("arch") == pipeline]
    experiments = [e for e in _names("experiment") if _selected(CONFIGS / "experiment" / f"{e}.yaml", "model") in models]
    others = [p for p in PIPELINES if p != pipeline]
    foreign = tuple(key for p in others for key in OWN_KEYS[p])
    foreign_experiments = set(_names("experiment")) - set(experiments)
    sweeps = []
    for name in _names("sweep"):
        params = OmegaConf.load(CONFIGS / "sweep" / f"{name}.yaml").hydra.sweeper.params
        named = str(params.get("experiment", ""))
        if not any(str(k).startswith(foreign) for k in params) and not any(e in named for e in foreign_experiments):
            if "glob(" not in named or any(e.startswith(named[5:-1].split("*")[0]) for e in experiments):
                sweeps.append(name)
    return {
        "model": models,
        "experiment": experiments,
        f"{pipeline}_recipe": _names(f"{pipeline}_recipe"),
        "optimizer": _names("optimizer"),
        "+sweep": sweeps,
        "hydra/launcher": _names("hydra/launcher"),
    }


def register_help(pipeline: str, description: str) -> None:
    """`--help` of the entry point: its own presets, then the composed config."""
    choices = "\n".join(f"  {group}: {', '.join(options)}" for group, options in presets(pipeline).items())
    template = (
        f"{PIPELINES[pipeline]}: {description}\n\n== Presets of this pipeline (group=option) ==\n{choices}\n\n"
        "== Config ==\nOverride anything in the config (foo.bar=value); the README explains each setting.\n\n$CONFIG\n"
    )
    ConfigStore.instance().store(
        group="hydra/help", name=pipeline, node={"app_name": PIPELINES[pipeline], "header": "", "footer": "", "template": template}
    )


def _schema(name: str) -> type:
    """The dataclass of a schema the pipeline stored in Hydra's ConfigStore (`register_configs`)."""
    return OmegaConf.get_type(ConfigStore.instance().load(f"{name}.yaml").node)


def misspelt_key(pipeline: str, overrides: list[str]) -> str | None:
    """"KEY is not a setting; did you mean ...?" for the first override whose key the
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
        schema = _schema(f"schema_{pipeline}_run")
        for depth, part in enumerate(parts):
            fields = typing.get_type_hints(schema)
            if part not in fields:
                known = list(fields) + (sorted(groups) if depth == 0 else [])
                prefix = ".".join(parts[:depth] + [""])
                close = difflib.get_close_matches(part, known, n=1)
                hint = f"did you mean {prefix}{close[0]}?" if close else f"{prefix.rstrip('.') or 'the config'} has {', '.join(fields)}"
                return f"{key} is not a setting; {hint}"
            kind = fields[part]
            if depth == 0 and part == "model":
                kind = _schema(f"model/schema_{pipeline}")
            if not dataclasses.is_dataclass(kind):
                break  # a value, or a section the schema leaves open
            schema = kind
    return None


def check_command_line(pipeline: str, argv: list[str]) -> None:
    """Stop with one line if `argv` picks another pipeline's model or experiment, or names a
    key the pipeline does not have."""
    problem = misspelt_key(pipeline, [a for a in argv if not a.startswith("-") and ("=" in a or a.startswith("~"))])
    if problem:
        sys.exit(f"error: {problem}")
    own = presets(pipeline)
    for argument in argv:
        key, _, value = argument.lstrip("+~").partition("=")
        if key in ("model", "experiment") and value:
            for option in value.split(","):
                if option in _names(key) and option not in own[key]:
                    owner = next(p for p in PIPELINES if option in presets(p)[key])
                    sys.exit(
                        f"error: {key}={option} is a preset of {PIPELINES[owner]}; {PIPELINES[pipeline]} takes "
                        f"{key}={' | '.join(own[key]) or '(none)'}"
                    )
