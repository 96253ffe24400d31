"""What both pipelines' configs share: the errors a run reports in one line, value checks, and
the structured-config schemas of the shared sections.

Values live in the YAML files under `configs/` only. The dataclasses here and in each
pipeline's `config.py` are Hydra schemas that give types and required keys (`MISSING`), not
defaults: a misspelt key or a string where a number belongs fails at composition. Checks that
a type cannot express (ranges, choices) raise `ConfigError` before any work. Optimizer
settings are checked in one place, `horst_sparse.training.optim` (their keys against the class's
signature, then the class's own constructor); the schema leaves that section open (`run_schema`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any, Iterable, List, Mapping, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

# `${run_suffix:${hydra:overrides.task}}` in the run folder names (configs/train_*.yaml): "_key=value,..."
# of the command line's overrides, nothing without any. Left out: the keys the name spells already
# and those that change no result (horst_sparse.training.no_effect), so a run staged elsewhere or logged otherwise
# continues in its folder; `/` becomes `_`, and a suffix too long for a file name keeps its start and
# a hash of the whole (the same overrides, the same folder).
_NAMED_KEYS = ("seed", "optimizer", "model", "acdc.sparsity", "study")
_SUFFIX_CHARS = 120


def run_suffix(overrides) -> str:
    import hashlib

    from horst_sparse.training.no_effect import no_effect

    kept = []
    for override in overrides:
        key = str(override).split("=", 1)[0].lstrip("+~")
        if key in _NAMED_KEYS or key.startswith("hydra") or no_effect(key):
            continue
        kept.append(str(override).lstrip("+").replace("/", "_"))
    suffix = ",".join(kept)
    if len(suffix) > _SUFFIX_CHARS:
        suffix = f"{suffix[: _SUFFIX_CHARS - 11]}-{hashlib.sha1(suffix.encode()).hexdigest()[:10]}"
    return f"_{suffix}" if suffix else ""


OmegaConf.register_new_resolver("run_suffix", run_suffix, replace=True)

import horst_sparse.training.resolvers  # noqa: E402, F401  (registers the configs' resolvers, e.g. `sum`, for every entry point)


class RunError(Exception):
    """A problem the user can fix, reported as one line (no traceback) with `exit_code`."""

    exit_code = 2


class ConfigError(RunError, ValueError):
    """A config value that cannot work; the message names the key and the fix."""


@dataclasses.dataclass
class LoggingConfig:
    project: str = MISSING
    mode: Optional[str] = MISSING  # online | offline | disabled; null: $WANDB_MODE, else offline
    name: Optional[str] = MISSING  # null: the run folder's name
    group: Optional[str] = MISSING
    tags: List[str] = MISSING


@dataclasses.dataclass
class RunConfig:
    """The keys every pipeline has besides its own sections."""

    tuned_as: str = MISSING  # whose tuned values the run reads (configs/tuned/): its optimizer's, or its arm's own
    pipeline: str = MISSING  # which pipeline the config is (horst_sparse.pipeline's registry): its primary config says
    model: Any = MISSING  # configs/model/*.yaml, typed by the pipeline's model schema
    optimizer: Any = MISSING  # configs/optimizer/*.yaml: `_target_` + `_partial_`, checked by the class itself
    tuned: Any = MISSING  # configs/tuned/<pipeline>/<recipe>.yaml: every arm's values under the recipe, a section each
    hparams: Any = MISSING  # tuned.<tuned_as>: the section the recipe's train.* and the optimizer read
    logging: LoggingConfig = MISSING
    seed: int = MISSING
    device: str = MISSING  # auto | cpu | cuda
    precision: str = MISSING  # auto (bf16 autocast on CUDA, fp32 on CPU) | bf16 | fp32
    deterministic: bool = MISSING
    compile: bool = MISSING  # torch.compile the model
    cpu_threads: Optional[int] = MISSING  # torch intra-op threads; null: torch's default
    # a CPU run refuses to start outside the reproducible CPU mode (horst_sparse.cpu_mode): the same
    # bits on any x86 CPU with AVX2 at the same cpu_threads (which it needs fixed)
    reproducible_cpu: bool = MISSING
    resume: Optional[str] = MISSING  # auto: latest checkpoint in the run folder | never | a path
    resume_override: List[str] = MISSING  # keys whose new values replace the checkpoint's on resume
    arm: Optional[str] = None  # a study's label of the run (an arm: configs/experiment/), recorded in config.yaml
    # a tuning trial's cells (horst_sparse.study.trial.trial): its score is the mean over one run at each
    # value, e.g. {acdc: {sparsity: [0.7, 0.8, 0.9]}} (a search space sets it); a run alone ignores it
    tune_over: Any = None


def run_schema(schema: type) -> DictConfig:
    """`schema` as the ConfigStore node of a pipeline's run config (its `register_configs`), with
    the `optimizer` section left open.

    Hydra closes every section after composing, so `optimizer.lr_=1e-3` would fail in composition
    with six lines advising `+optimizer.lr_`. The optimizer's keys are its class's keyword arguments
    and the class's signature judges them (`horst_sparse.training.optim`): open, the section lets a
    misspelt key reach that check, which names the closest key in one line."""
    node = OmegaConf.structured(schema)
    node.optimizer = {}
    OmegaConf.set_struct(node.optimizer, False)
    return node


# An optimizer or resume_override key that means a learning rate: its hint is the pipeline's `lr_key`.
LR_LIKE = re.compile(r"(^|_)lr|learning_?rate", re.IGNORECASE)  # lr, lr_, lrr, base_lr, learning_rate


def pipeline_lr_key(cfg: Mapping[str, Any]) -> str | None:
    """The config key of the learning rate of the pipeline `cfg` belongs to (`Pipeline.configs.lr_key`)."""
    from horst_sparse.pipeline import UnknownPipeline, of

    try:
        return of(cfg).configs.lr_key
    except UnknownPipeline:
        return None


def check_known_keys(node: Mapping[str, Any], schema: type, *, prefix: str = "") -> None:
    """Refuse keys the schema does not have (added with `+`, which Hydra accepts even in a
    typed section), naming the closest real key."""
    import typing

    fields = typing.get_type_hints(schema)
    for key in node:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = (
                f"; did you mean {prefix}{close[0]}?"
                if close
                else f"; {prefix.rstrip('.') or 'the config'} has {', '.join(fields)}"
            )
            raise ConfigError(f"{prefix}{key} is not a setting{hint}")
    for name, kind in fields.items():
        if dataclasses.is_dataclass(kind) and isinstance(node.get(name), Mapping):
            check_known_keys(node[name], kind, prefix=f"{prefix}{name}.")


def check_resume_override(cfg: Mapping[str, Any]) -> None:
    """Refuse a key of `resume_override` that the config does not have, naming the closest one
    (or, for an lr-like key, the pipeline's learning rate): the runner would change nothing for it
    and resume with the checkpoint's value."""
    config = OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else cfg
    for key in config.get("resume_override") or []:
        node, parts = config, str(key).split(".")
        for depth, part in enumerate(parts):
            if isinstance(node, Mapping) and part in node:
                node = node[part]
                continue
            known = [str(k) for k in node] if isinstance(node, Mapping) else []
            prefix = ".".join(parts[:depth] + [""])
            close = difflib.get_close_matches(part, known, n=1)
            lr_key = pipeline_lr_key(config) if LR_LIKE.search(part) else None
            if close:
                hint = f"did you mean {prefix}{close[0]}?"
            elif lr_key:
                hint = f"the learning rate is {lr_key}"
            else:
                hint = f"{prefix.rstrip('.') or 'the config'} has {', '.join(known) or 'no keys'}"
            raise ConfigError(f"resume_override has {key}, which is not a setting; {hint}")


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def validate_run(cfg: Mapping[str, Any]) -> None:
    """The checks of the keys in `RunConfig`."""
    require(cfg["device"] in ("auto", "cpu", "cuda"), f"device={cfg['device']!r} is unknown; use auto, cpu or cuda")
    require(
        cfg["precision"] in ("auto", "bf16", "fp32"),
        f"precision={cfg['precision']!r} is unknown; use auto, bf16 or fp32",
    )
    require(
        cfg["cpu_threads"] is None or cfg["cpu_threads"] > 0,
        f"cpu_threads={cfg['cpu_threads']} must be positive or null",
    )
    mode = cfg["logging"]["mode"]
    require(
        mode in (None, "online", "offline", "disabled"),
        f"logging.mode={mode!r} is unknown; use online, offline, disabled or null ($WANDB_MODE)",
    )
    check_resume_override(cfg)


def validate_sparsities(sparsities: Iterable[float], *, key: str) -> None:
    for s in sparsities:
        require(0 <= s < 1, f"{key} has {s}: every sparsity must be in [0, 1)")
