"""What both pipelines' configs share: the errors a run reports in one line, value checks, and
the structured-config schemas of the shared sections.

Values live in the YAML files under `configs/` only. The dataclasses here and in each
pipeline's `config.py` are Hydra schemas that give types and required keys (`MISSING`), not
defaults: a misspelt key or a string where a number belongs fails at composition. Checks that
a type cannot express (ranges, choices) raise `ConfigError` before any work. Optimizer
settings are checked in one place, the optimizer's own constructor (`horst_sparse.training.optim`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, List, Mapping, Optional

from omegaconf import MISSING, OmegaConf

# `${run_suffix:${hydra:overrides.task}}` in the run folder names (configs/train_*.yaml): "_key=value,..."
# of the command line's overrides, nothing without any. Left out: the keys the name spells already
# and those that change no result (horst_sparse.training.no_effect), so a run staged elsewhere or logged otherwise
# continues in its folder; `/` becomes `_`, and a suffix too long for a file name keeps its start and
# a hash of the whole (the same overrides, the same folder).
_NAMED_KEYS = ("seed", "optimizer", "model", "acdc.sparsity", "sweep", "study")
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
    tuned: Any = MISSING  # configs/tuned/<pipeline>/<recipe>.yaml: every optimizer's values under the recipe
    logging: LoggingConfig = MISSING
    seed: int = MISSING
    device: str = MISSING  # auto | cpu | cuda
    precision: str = MISSING  # auto (bf16 autocast on CUDA, fp32 on CPU) | bf16 | fp32
    deterministic: bool = MISSING
    compile: bool = MISSING  # torch.compile the model
    cpu_threads: Optional[int] = MISSING  # torch intra-op threads; null: torch's default
    resume: Optional[str] = MISSING  # auto: latest checkpoint in the run folder | never | a path
    resume_override: List[str] = MISSING  # keys whose new values replace the checkpoint's on resume
    arm: Optional[str] = None  # a study's label of the run (configs/arm/), recorded in config.yaml
    # a tuning trial's cells (horst_sparse.study.tuning.trial): its score is the mean over one run at each
    # value, e.g. {acdc: {sparsity: [0.7, 0.8, 0.9]}} (a search space sets it); a run alone ignores it
    tune_over: Any = None


def check_known_keys(node: Mapping[str, Any], schema: type, *, prefix: str = "") -> None:
    """Refuse keys the schema does not have (added with `+`, which Hydra accepts even in a
    typed section), naming the closest real key."""
    import difflib
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


def validate_sparsities(sparsities: Iterable[float], *, key: str) -> None:
    for s in sparsities:
        require(0 <= s < 1, f"{key} has {s}: every sparsity must be in [0, 1)")
