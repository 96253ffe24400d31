"""Tuning one arm (an optimizer, or an arm with values of its own, under one recipe) with a fixed
budget on the validation split: quasi-random search over `configs/hparams_search/<pipeline>_<arm>.yaml`
through Hydra's multirun (hydra-optuna-sweeper, any launcher), the best trials rerun at more tuning
seeds, and the pick written where the runs read it, the arm's section of
`configs/tuned/<pipeline>/<recipe>.yaml`, with its provenance; every trial is a row of `results/tuning/<pipeline>/<recipe>/tuning.csv`."""

from __future__ import annotations

import dataclasses
import datetime
import math
import subprocess
import sys
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

with warnings.catch_warnings():  # optuna 2.10 (hydra-optuna-sweeper's pin) names SQLAlchemy's pre-2.0 API
    warnings.simplefilter("ignore", DeprecationWarning)
from omegaconf import OmegaConf

from horst_sparse.analysis.tuning_curves import REFINE, RERUN, SAMPLED, SEARCH
from horst_sparse.compose import VERSION_BASE, ComposeError, compose_in_context, hydra_context
from horst_sparse.paths import CONFIGS
from horst_sparse.paths import REPO as ROOT
from horst_sparse.paths import RESULTS as RESULTS_ROOT
from horst_sparse.pipeline import Pipeline, TuningScore, UnknownPipeline
from horst_sparse.pipeline import get as get_pipeline
from horst_sparse.study.trial import (
    EVAL_SPLIT,
    TUNING_SEEDS_START,
    TuningError,
    cell_folder,
    cells,
    swept,
    trial,
    trial_score,
    validation_score,
)
from horst_sparse.training.config import RunError
from horst_sparse.training.run_log import FAILED_FILE, SUMMARY_FILE, git_commit

RESULTS = RESULTS_ROOT / "tuning"
REFINE_SCRAMBLE = 1  # the second stage's Sobol scramble (the search's: configs/hydra/sweeper/sampler/sobol.yaml's 0)
DEFAULT_TRIALS = 16
# the pick noise of one seed: the best trials rerun at more tuning seeds, the pick the best mean (Choi et al. 2019
# pick on one seed; with seed noise the size of the arms' differences a pick on one seed is partly luck)
DEFAULT_TOP_K, DEFAULT_RERUN_SEEDS = 3, 2
# --out DIR writes the pick as DIR/pick/<arm>.yaml, a config group option of a search path DIR: a run loads it with
# `--config-dir DIR +pick=<arm>` (merged at tuned.<arm>, after the recipe's values)
PICK_GROUP = "pick"


# ---- one arm's tuning ------------------------------------------------------------------------


@dataclasses.dataclass
class Tuning:
    """What a tuning will do, from the composed config, checked before any trial."""

    pipeline: str
    arm: str  # the optimizer tuned
    recipe: str
    tuned_file: Path  # configs/tuned/<pipeline>/<recipe>.yaml: the pick goes into its section `<arm>:`
    space: dict[str, str]  # dotted key: the sweeper's distribution
    seed: int
    trials: int
    arguments: list[str]  # the multirun's command line
    overrides: list[str] = dataclasses.field(default_factory=list)  # the user's, of every trial
    selection: list[str] = dataclasses.field(default_factory=list)  # what selects the arm: optimizer=horst, ...
    tune_over: Any = None  # a trial's cells (the search space's `tune_over`)
    subdir: str = ""  # hydra.sweep.subdir=...: a trial folder's name, its cells' values in it (trial_subdir)
    left_out: list[str] = dataclasses.field(default_factory=list)  # keys of the space --keys did not search
    engine: str = "reference"  # the kernels its trials ran on (horst_sparse.training.engine): its runs' too

    @property
    def metric(self) -> TuningScore:
        return get_pipeline(self.pipeline).tuning

    @property
    def objective(self) -> str:
        """What a trial's score is: the pipeline's metric, averaged over the trial's cells where it has several."""
        runs = cells(self.tune_over)
        if runs == [{}]:
            return self.metric.description
        return f"{self.metric.description}, the mean over {'; '.join(cell_folder(c) for c in runs)}"


def require_clean_tree(root: Path | None = None, *, tuning: tuple[str, str] | None = None) -> str:
    """The commit of a clean git tree (this repository's unless `root`; results/, the tuning records
    and a study's tables, aside), or a one-line `TuningError`: a pick must name the code that made it.
    With `tuning=(pipeline, arm)` the other arms' picks of that pipeline (their sections of
    configs/tuned/<pipeline>/<recipe>.yaml) may be uncommitted too: a study tunes its arms one after
    another, and an arm's trials read only its own section."""
    from horst_sparse.study.provenance import uncommitted

    root = ROOT if root is None else root
    commit = git_commit(root)
    if commit == "unknown":
        raise TuningError(f"{root} is not a git repository: a pick records the commit it was made at")

    def allowed(
        path: str,
    ) -> bool:  # another arm's pick: a tuned file of the pipeline's, this arm's section as committed
        if tuning is None or not (path.startswith(f"configs/tuned/{tuning[0]}/") and path.count("/") == 3):
            return False
        committed = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=root, capture_output=True, text=True)
        mine = (yaml.safe_load(committed.stdout) or {}).get(tuning[1]) if committed.returncode == 0 else None
        return mine is not None and mine == read_section(root / path, tuning[1])

    if changed := uncommitted(root, allowed):
        raise TuningError(
            f"the git tree at {root} has uncommitted changes ({changed[0]}, ...): commit or stash them "
            "first; a pick records the commit it was made at"
        )
    return commit.removesuffix("-dirty")


def prepare(
    pipeline: str,
    arm: str,
    *,
    trials: int = DEFAULT_TRIALS,
    overrides: Iterable[str] = (),
    config_dir: Path = CONFIGS,
    sweep_dir: Path | None = None,
    elsewhere: bool = False,
    keys: Iterable[str] | None = None,
) -> Tuning:
    """Compose the tuning's config and check that its pick can reach a run: every searched key
    reads the arm's tuned section, the seed is a tuning seed, the split is validation, and no
    override changes the recipe's training (unless the pick goes `elsewhere` than the recipe's
    tuned file). An arm is an optimizer or an arm (configs/experiment/) with values of its own
    (`tuned_as`, e.g. horst_prunable). With `keys`, only those keys of the space are searched."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from horst_sparse.training.presets import misspelt_key, unknown_option

    try:
        registered = get_pipeline(pipeline)
    except UnknownPipeline as error:
        raise TuningError(str(error)) from None
    search = config_dir / "hparams_search" / f"{pipeline}_{arm}.yaml"
    if not search.is_file():
        known = sorted(p.stem.split("_", 1)[1] for p in search.parent.glob(f"{pipeline}_*.yaml"))
        raise TuningError(f"no search space for {arm} on {pipeline} ({search} is missing); tunable: {', '.join(known)}")
    if trials < 1:
        raise TuningError(f"--trials {trials}: a tuning needs at least one trial")
    registered.configs.register()
    if problem := misspelt_key(pipeline, list(overrides)) or unknown_option(list(overrides)):
        raise TuningError(problem)
    arguments = [f"+hparams_search={pipeline}_{arm}", *overrides]
    parsed = OverridesParser.create().parse_overrides(list(overrides))  # a sweep here replaces the YAML's
    searched = {o.key_or_group: o.input_line.split("=", 1)[1] for o in parsed if o.is_sweep_override()}
    changed = recipe_changes(registered, parsed)
    if changed and not elsewhere:
        raise TuningError(
            f"{', '.join(changed)} change the recipe's training, so the pick would not be the recipe's: "
            "give --out <folder> to write it there, or drop them (configs/tuned/ holds each recipe's own picks)"
        )
    with hydra_context(config_dir, job_name="tune"):
        try:
            cfg = compose_in_context(
                registered, [a for a, o in zip(arguments, [None, *parsed]) if o is None or not o.is_sweep_override()]
            )
        except ComposeError as error:
            raise TuningError(str(error)) from None
    choices = cfg.hydra.runtime.choices
    recipe = choices[registered.recipe_group]
    if cfg.tuned_as != arm:
        raise TuningError(f"{search.name} tunes the values of {cfg.tuned_as} (tuned_as), not {arm}'s")
    tuned_file = config_dir / "tuned" / pipeline / f"{recipe}.yaml"
    if not isinstance(read_section(tuned_file, arm), dict):
        raise TuningError(f"the {recipe} recipe has no tuned values for {arm} (no `{arm}:` section in {tuned_file})")
    if cfg.seed < TUNING_SEEDS_START:
        raise TuningError(f"seed={cfg.seed}: tuning seeds start at {TUNING_SEEDS_START} (reporting seeds are below it)")
    if cfg.get("eval_split") != EVAL_SPLIT:
        raise TuningError(f"eval_split={cfg.get('eval_split')}: tuning scores on the validation split only")
    space = {**{str(k): str(v) for k, v in cfg.hydra.sweeper.params.items()}, **searched}
    whole = list(space)
    if keys is not None:
        space = restrict(space, list(keys), search.name, searched)
        # the sweeper searches its params and the command line's sweeps: the YAML's params go, the kept keys
        # come back as sweeps in the space's order (the order the Sobol sampler gives coordinates in)
        arguments = [
            arguments[0],
            "hydra.sweeper.params=null",
            *(f"{key}={value}" for key, value in space.items()),
            *(a for a, o in zip(overrides, parsed) if not o.is_sweep_override()),
        ]
    tuned = OmegaConf.to_container(cfg.tuned[arm], resolve=False)
    for key in space:
        leaf = key.rsplit(".", 1)[-1]
        wire = OmegaConf.to_container(OmegaConf.select(cfg, key.rsplit(".", 1)[0]), resolve=False).get(leaf)
        # the optimizer's YAML and the recipe read the run's section, `hparams` (tuned.<tuned_as>; docs/design.md §7)
        if leaf not in tuned or wire not in {f"${{tuned.{arm}.{leaf}}}", f"${{hparams.{leaf}}}"}:
            others = [k for k in space if k != key]
            hint = f"; leave it out with --keys {','.join(others)}" if others else ""
            raise TuningError(
                f"{search.name} searches {key}, which the run does not read from tuned.{arm}.{leaf} "
                f"(it is {wire!r}): the pick would never reach a run{hint}"
            )
    if sweep_dir is None:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        sweep_dir = ROOT / "multirun" / "tuning" / f"{pipeline}_{recipe}_{arm}" / stamp
    tune_over = OmegaConf.to_container(cfg.tune_over, resolve=True) if cfg.get("tune_over") else None
    subdir = trial_subdir(OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["subdir"], tune_over)
    arguments += [
        f"hydra.sweeper.n_trials={trials}",
        f"hydra.sweeper.direction={registered.tuning.direction}",
        f"hydra.sweep.dir={sweep_dir}",
        subdir,
    ]
    left_out = [key for key in whole if key not in space]
    return Tuning(pipeline, arm, recipe, tuned_file, space, int(cfg.seed), trials, arguments, list(overrides),
                  selection(search), tune_over, subdir, left_out, cfg.get("engine", "reference"))  # fmt: skip


def restrict(space: Mapping[str, str], keys: list[str], name: str, searched: Mapping[str, str]) -> dict[str, str]:
    """The part of `space` that `keys` names (--keys), or a one-line TuningError naming the space's keys."""
    unknown = [key for key in keys if key not in space]
    if unknown or not keys:
        named = f"{','.join(unknown)} is not a key of the search space" if keys else "names no key"
        raise TuningError(f"--keys {named}; {name} searches {', '.join(space)}")
    if dropped := [key for key in searched if key not in keys]:
        raise TuningError(
            f"{dropped[0]}={searched[dropped[0]]} sweeps a key --keys leaves out: add {dropped[0]} to --keys "
            "or drop the sweep"
        )
    return {key: value for key, value in space.items() if key in keys}


def trial_subdir(template: str, tune_over: Any) -> str:
    """The `hydra.sweep.subdir=...` override that names a trial folder by what it holds: the pipeline's
    subdir with each key the trial runs over (`tune_over`) at all its values, `..._s0.7,0.8,0.9_seed100_...`
    for a ViT trial with a run at each of those sparsities (one value: the pipeline's name as it is)."""
    for key, values in swept(tune_over).items():
        template = template.replace("${" + key + "}", ",".join(str(v) for v in dict.fromkeys(values)))
    return f"hydra.sweep.subdir='{template}'"  # quoted: the commas are not a sweep; interpolations resolve


# Overrides a tuning may take without its pick ceasing to be the recipe's: where and how fast it runs
# (the launcher, threads, logging, data location: horst_sparse.training.no_effect), the recipe itself and
# the tuning seed (checked: 100 and up).
RECIPE_NEUTRAL = ("seed", "eval_split")


def recipe_changes(pipeline: Pipeline, parsed: Iterable[Any]) -> list[str]:
    """The overrides (not sweeps) that change what the recipe trains: `train.epochs=4`, `model=...`,
    `experiment=smoke_vit`."""
    from horst_sparse.training.no_effect import no_effect

    changed = []
    for override in parsed:
        key = override.key_or_group.lstrip("+~")
        if override.is_sweep_override() or key.startswith("hydra") or key == pipeline.recipe_group:
            continue
        if not no_effect(key) and key not in RECIPE_NEUTRAL:
            changed.append(override.input_line)
    return changed


def selection(search: Path) -> list[str]:
    """The overrides that select a search space's arm without the space: its defaults list's
    `override /optimizer: horst` (optimizer=horst) and `/experiment@_global_: horst_prunable`
    (+experiment@_global_=horst_prunable: an arm with values of its own, beside any experiment preset)."""
    chosen = []
    for entry in yaml.safe_load(search.read_text()).get("defaults", []):
        if isinstance(entry, Mapping):
            for key, value in entry.items():
                group = key.removeprefix("override ").strip().lstrip("/")
                if group.split("@")[0] in ("optimizer", "experiment"):
                    chosen.append(f"{'' if key.startswith('override ') else '+'}{group}={value}")
    return chosen


def _multirun(plan: Tuning, arguments: list[str], sweep_dir: Path, config_dir: Path) -> None:
    """`<entry point> -m <arguments>` of the trials, through Hydra's own command line (sweeper and launcher
    as configured). A failed trial (a diverged lr) is a result, which scores worst: the runner's non-zero
    exit after a multirun with failed cells is left to the trials' folders."""
    import hydra

    registered = get_pipeline(plan.pipeline)
    registered.configs.register()
    main = hydra.main(config_path=str(config_dir), config_name=registered.config_name, version_base=VERSION_BASE)(trial)
    argv, sys.argv = sys.argv, [registered.script, "-m", *arguments]
    try:
        main()
    except SystemExit as exit:
        if not any(sweep_dir.glob(f"**/{FAILED_FILE}")):
            raise
        print(f"{exit.code}: they score worst in this tuning", file=sys.stderr)
    finally:
        sys.argv = argv


def run_trials(plan: Tuning, config_dir: Path = CONFIGS) -> Path:
    sweep_dir = Path(next(a.split("=", 1)[1] for a in plan.arguments if a.startswith("hydra.sweep.dir=")))
    _multirun(plan, plan.arguments, sweep_dir, config_dir)
    return sweep_dir


def folder_score(plan: Tuning, folder: Path, config: Mapping[str, Any]) -> tuple[float, str]:
    """A trial's score from its folder (each cell's run in a subfolder where it has cells) and
    whether every run finished (a failed one holds the runner's failed.json, not a summary)."""
    import json

    pipeline = get_pipeline(plan.pipeline)
    summaries = [folder / cell_folder(cell) / SUMMARY_FILE for cell in cells(config.get("tune_over"))]
    scores = [validation_score(pipeline, json.loads(s.read_text()) if s.is_file() else {}) for s in summaries]
    return trial_score(pipeline.tuning, scores), "finished" if all(s.is_file() for s in summaries) else "failed"


def collect(
    plan: Tuning, sweep_dir: Path, *, stage: str = SEARCH, trial: int | None = None, first: int = 0
) -> list[dict[str, Any]]:
    """One row per trial (or, for a rerun sweep, per seed of `trial`), from the trial folders
    (each has Hydra's overrides and its runs' summaries or failure records), in trial order; a
    sampling stage's trials numbered from `first` (the second stage's after the search's)."""
    rows = []
    for folder in sorted(
        (p for p in sweep_dir.iterdir() if (p / ".hydra" / "overrides.yaml").is_file()),
        key=lambda p: int(p.name.split("_", 1)[0]),
    ):
        overrides = dict(o.split("=", 1) for o in yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()))
        config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
        score, status = folder_score(plan, folder, config)
        rows.append({
            "pipeline": plan.pipeline, "recipe": plan.recipe, "arm": plan.arm,
            "trial": first + int(folder.name.split("_", 1)[0]) if trial is None else trial, "stage": stage,
            "seed": int(config["seed"]), **{key: yaml.safe_load(overrides[key]) for key in plan.space},
            "eval_split": config.get("eval_split"), "metric": plan.objective, "score": score, "status": status,
        })  # fmt: skip
    if trial is None and len(rows) != plan.trials:
        raise TuningError(f"{sweep_dir} has {len(rows)} finished trial folders, not the {plan.trials} planned")
    return rows


def _override_value(value: Any) -> str:
    """A value in Hydra's override grammar: {a:{b:[0.7,0.8]}}."""
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_override_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    return str(value)


def run_reruns(
    plan: Tuning,
    rows: list[dict[str, Any]],
    candidates: list[int],
    *,
    seeds: int,
    sweep_dir: Path,
    config_dir: Path = CONFIGS,
) -> list[dict[str, Any]]:
    """Rerun the `candidates` (trial numbers, the best first: `top`) at `seeds` more tuning seeds, the
    ones after the search's, each at the values it was sampled at; one row per rerun."""
    if seeds < 1:
        return []
    found = []
    for number in candidates:
        row = next(r for r in rows if r["trial"] == number and r["stage"] in SAMPLED)
        rerun_dir = sweep_dir / "rerun" / f"trial{number}"
        arguments = [
            *plan.selection,
            *(o for o in plan.overrides
              if not o.startswith(("hydra.sweeper.", "hydra/sweeper")) and o.split("=", 1)[0] not in plan.space),
            *(f"{key}={row[key]}" for key in plan.space),
            f"seed={','.join(str(plan.seed + 1 + i) for i in range(seeds))}",
            f"eval_split={EVAL_SPLIT}",
            *([f"tune_over={_override_value(plan.tune_over)}"] if plan.tune_over else []),
            f"hydra.sweep.dir={rerun_dir}",
            *([plan.subdir] if plan.subdir else []),
        ]  # fmt: skip
        _multirun(plan, arguments, rerun_dir, config_dir)
        found += collect(plan, rerun_dir, stage=RERUN, trial=number)
    return found


def _interval(distribution: str) -> Any:
    """A sweeper distribution as Hydra parses it: an IntervalSweep (start, end, tags) or a choice."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(f"key={distribution}").value()


def _written(sweep: Any, low: float, high: float) -> str:
    """An interval of `sweep`'s kind (int, log-tagged or plain) from `low` to `high`."""
    if isinstance(sweep.start, int) and isinstance(sweep.end, int):
        return f"int(interval({round(low)}, {round(high)}))"
    text = f"interval({low:.6g}, {high:.6g})"
    return f"tag(log, {text})" if "log" in (sweep.tags or set()) else text


def refine_space(space: Mapping[str, str], best: Mapping[str, Any], radius: float) -> dict[str, str]:
    """The second search stage's space: the box of half-width `radius` around the first stage's
    best point, in the unit cube the Sobol points fill (the ball of the pick's stability guard,
    horst_sparse.analysis.tuning_curves.Stability). A log key's box goes past its range's ends, so
    that a best point at an edge is refined beyond it; a linear key's (a warm-up) stops at them; a
    choice keeps the best's value."""
    from hydra.core.override_parser.types import IntervalSweep

    box = {}
    for key, distribution in space.items():
        sweep = _interval(distribution)
        if not isinstance(sweep, IntervalSweep):
            box[key] = f"choice({best[key]})"
            continue
        u, log = position(float(best[key]), distribution), "log" in (sweep.tags or set())
        ends = [u - radius, u + radius] if log else [max(u - radius, 0.0), min(u + radius, 1.0)]
        low, high = float(sweep.start), float(sweep.end)
        if log:
            box[key] = _written(sweep, *(low * (high / low) ** t for t in ends))
        else:
            box[key] = _written(sweep, *(low + t * (high - low) for t in ends))
    return box


def union(space: Mapping[str, str], box: Mapping[str, str]) -> dict[str, str]:
    """Each interval key's range over both stages (the search's and the second stage's box): where
    the pick's edges are judged after a second stage."""
    from hydra.core.override_parser.types import IntervalSweep

    joined = dict(space)
    for key, distribution in space.items():
        first, second = _interval(distribution), _interval(box[key])
        if isinstance(first, IntervalSweep):
            joined[key] = _written(first, min(first.start, second.start), max(first.end, second.end))
    return joined


def run_refinement(
    plan: Tuning, rows: list[dict[str, Any]], *, trials: int, radius: float, sweep_dir: Path, config_dir: Path
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The second stage: `trials` fresh quasi-random points (the Sobol sequence's next scramble, not the
    search's points rescaled) in `refine_space` around the search's best trial, numbered after the
    search's; its rows and its space."""
    best = top(rows, plan.metric, 1)[0]
    box = refine_space(plan.space, next(r for r in rows if r["trial"] == best), radius)
    stage = prepare(
        plan.pipeline, plan.arm, trials=trials, config_dir=config_dir, sweep_dir=sweep_dir / REFINE, elsewhere=True,
        keys=list(plan.space),
        overrides=[*(o for o in plan.overrides if o.split("=", 1)[0] not in box), *(f"{k}={v}" for k, v in box.items()),
                   f"hydra.sweeper.sampler.seed={REFINE_SCRAMBLE}"],
    )  # fmt: skip
    _multirun(stage, stage.arguments, sweep_dir / REFINE, config_dir)
    return collect(stage, sweep_dir / REFINE, stage=REFINE, first=1 + max(r["trial"] for r in rows)), box


def top(rows: list[dict[str, Any]], metric: TuningScore, k: int, stability: Any = None) -> list[int]:
    """The k best sampled trials by their search-seed score (the earlier on a tie); with a `stability`
    guard the k best stable ones (horst_sparse.analysis.tuning_curves.stable_top)."""
    import pandas as pd

    from horst_sparse.analysis.tuning_curves import stable_top

    maximize = metric.direction == "maximize"
    if stability is not None:
        return stable_top(pd.DataFrame(rows), maximize=maximize, top_k=k, stability=stability)
    sign = 1 if maximize else -1
    sampled = sorted((r for r in rows if r["stage"] in SAMPLED), key=lambda r: (-sign * r["score"], r["trial"]))
    return [r["trial"] for r in sampled[: max(k, 1)]]


def stability_guard(space: Mapping[str, str], radius: float | None) -> Any:
    """The pick's guard over the searched interval keys (`Stability`); None without a radius."""
    from hydra.core.override_parser.types import IntervalSweep

    from horst_sparse.analysis.tuning_curves import Stability

    if radius is None:
        return None
    keys = {}
    for key, distribution in space.items():
        if isinstance(sweep := _interval(distribution), IntervalSweep):
            keys[key] = (float(sweep.start), float(sweep.end), "log" in (sweep.tags or set()))
    return Stability(keys, radius)


EDGE = 0.05  # a pick within this fraction of its range's ends, in the range's scale, may be cut off by it


def position(value: float, distribution: str) -> float:
    """Where `value` lies in a sweeper distribution such as `tag(log, interval(1e-4, 1e-2))`: 0 at
    its lower end, 1 at its upper, in its scale (log where tagged so)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweep = OverridesParser.create().parse_override(f"key={distribution}").value()
    low, high = float(sweep.start), float(sweep.end)
    if "log" in (sweep.tags or set()):
        low, high, value = math.log(low), math.log(high), math.log(value)
    return (value - low) / (high - low)


def edges(space: Mapping[str, str], pick: Mapping[str, Any]) -> list[str]:
    """The searched keys whose pick lies in the outer EDGE of their range: `optimizer.alpha at the
    lower edge`. A range that cuts off its optimum shows there; widen it, or declare the edge."""
    found = []
    for key, distribution in space.items():
        if "interval(" not in distribution:
            continue  # a choice has no edge
        u = position(float(pick[key]), distribution)
        if u < EDGE or u > 1 - EDGE:
            found.append(f"{key} at the {'lower' if u < EDGE else 'upper'} edge")
    return found


def pick(rows: list[dict[str, Any]], metric: TuningScore, top_k: int, stability: Any = None) -> dict[str, Any]:
    """The picked trial's sampled row, with `mean` (its score over every seed it ran), `seeds` and
    `flag`: the best mean over seeds among the `top_k` best sampled trials (the rule of
    horst_sparse.analysis.tuning_curves.pick, the one judge; without reruns, the best search score).
    With a `stability` guard, among the stable ones; where none is stable the unguarded pick,
    flagged with each candidate's reason (the arm has no stable point in its budget: a result)."""
    import pandas as pd

    from horst_sparse.analysis.tuning_curves import NoStablePick
    from horst_sparse.analysis.tuning_curves import pick as pick_rule

    frame = pd.DataFrame(rows)
    maximize, flag = metric.direction == "maximize", None
    try:
        chosen = pick_rule(frame, maximize=maximize, top_k=top_k, stability=stability)
    except NoStablePick as error:
        chosen, flag = pick_rule(frame, maximize=maximize, top_k=top_k), str(error)
    mine = frame[frame.trial == chosen]
    sampled = next(r for r in rows if r["trial"] == chosen and r["stage"] in SAMPLED)
    return {
        **sampled,
        "mean": float(mine.score.mean()),
        "seeds": {int(r.seed): float(r.score) for r in mine.itertuples()},
        "flag": flag,
    }


def read_section(path: Path, arm: str) -> Any:
    """The `arm:` section of a tuned file, as written (interpolations unresolved); None where it has none."""
    return (yaml.safe_load(path.read_text()) or {}).get(arm) if path.is_file() else None


def write_section(path: Path, arm: str, comment: str, values: Mapping[str, Any]) -> None:
    """Replace the `arm:` section of a tuned file, and the comment lines right above it, by `comment`
    and `values`; every other section and comment stays as it is (a new arm's section goes last)."""
    lines = path.read_text().splitlines(keepends=True)
    section = [f"{arm}:\n"] + [
        f"  {line}" for line in yaml.safe_dump(dict(values), sort_keys=False).splitlines(keepends=True)
    ]
    start = next((i for i, line in enumerate(lines) if line.startswith(f"{arm}:")), None)
    if start is None:
        begin = end = len(lines)
        comment = "\n" + comment
    else:
        begin, end = start, start + 1
        while begin and lines[begin - 1].startswith("#"):
            begin -= 1
        while end < len(lines) and lines[end].startswith(" "):
            end += 1
    path.write_text("".join([*lines[:begin], comment, *section, *lines[end:]]))


def write_pick(
    plan: Tuning,
    rows: list[dict[str, Any]],
    *,
    commit: str,
    command: str,
    top_k: int = 0,
    protocol: Any = None,
    results_dir: Path = RESULTS,
    csv: Path | None = None,
    dry_run: bool = False,
    package: bool = False,
    stability: Any = None,
    refined: Mapping[str, str] | None = None,
) -> dict:
    """The arm's section of the recipe's tuned file with the pick and its provenance (the keys
    outside the search space kept, the other sections untouched), and the arm's rows of tuning.csv
    (of this protocol version) replaced; with `dry_run`, the values only (nothing written). With
    `package` the file is the arm's section alone and says where it goes (`# @package tuned.<arm>`),
    so that a run adds it as an option of a group of its own (PICK_GROUP). `stability`: the pick's
    guard; `refined`: the second stage's space, where there was one (its edges are the union's)."""
    import pandas as pd

    chosen = pick(rows, plan.metric, top_k, stability)
    if not math.isfinite(chosen["mean"]):
        raise TuningError(f"every trial of {plan.arm} failed; nothing to pick (see the trial folders)")
    csv = csv or results_dir / plan.pipeline / plan.recipe / "tuning.csv"
    values = yaml.safe_load(plan.tuned_file.read_text()) if package else read_section(plan.tuned_file, plan.arm)
    for key in plan.space:
        values[key.rsplit(".", 1)[-1]] = chosen[key]
    search = [r for r in rows if r["stage"] == SEARCH]
    values["provenance"] = {
        "made_by": command,
        "commit": commit,
        "date": datetime.date.today().isoformat(),
        "protocol": None if protocol is None else {"version": protocol.version, "hash": protocol.hash,
                                                   "file": str(protocol.path.relative_to(ROOT))},
        "sampler": "horst_sparse.sobol.SobolSampler (scrambled Sobol, hydra-optuna-sweeper)",
        "space": plan.space,
        "left_out": plan.left_out,
        **({"engine": plan.engine} if plan.engine != "reference" else {}),  # v1-v6's picks: the reference engine
        "tune_over": plan.tune_over,
        "trials": len(search),
        "seeds": sorted({r["seed"] for r in search}),
        "top_k": top_k,
        "rerun_seeds": sorted({r["seed"] for r in rows if r["stage"] == RERUN}),
        "eval_split": EVAL_SPLIT,
        "metric": plan.objective,
        "direction": plan.metric.direction,
        "scores": [r["score"] for r in search],
        "pick": {"trial": chosen["trial"], "score": chosen["mean"], "seeds": chosen["seeds"]},
        "edges": edges(union(plan.space, refined) if refined else plan.space, chosen),
        "tuning_csv": str(csv.relative_to(ROOT) if csv.is_relative_to(ROOT) else csv),
    }  # fmt: skip
    if refined:
        second = [r for r in rows if r["stage"] == REFINE]
        values["provenance"]["refine"] = {"trials": len(second), "scramble": REFINE_SCRAMBLE, "space": dict(refined),
                                          "scores": [r["score"] for r in second]}  # fmt: skip
    if stability is not None:
        unstable = stability.unstable(pd.DataFrame(rows))
        values["provenance"]["stability"] = {
            "radius": stability.radius, "unstable": {int(t): why for t, why in sorted(unstable.items())},
            "flag": chosen["flag"],
        }  # fmt: skip
    rule = f"the best mean over seeds of its {top_k} best" if top_k else "the best of"
    header = (
        f"# {plan.arm} under the {plan.pipeline} {plan.recipe} recipe: {rule} {len(search)} quasi-random trials on the\n"
        f"# validation split, written by `{command}` at commit {commit}\n"
        "# (every trial: provenance.tuning_csv). Keys outside the search space keep their values.\n"
    )
    if package:  # first: Hydra reads a package directive only above every other line
        header = f"# @package tuned.{plan.arm}\n" + header
    if dry_run:
        return values
    if package:
        plan.tuned_file.write_text(header + yaml.safe_dump(values, sort_keys=False))
    else:
        write_section(plan.tuned_file, plan.arm, header, values)
    version = None if protocol is None else protocol.version
    frame = pd.DataFrame(
        [
            {
                **r,
                "pick": r["trial"] == chosen["trial"],
                "commit": commit,
                "protocol": version,
                "protocol_hash": None if protocol is None else protocol.hash,
            }
            for r in rows
        ]
    )
    if csv.is_file():
        earlier = pd.read_csv(csv)
        if "protocol" not in earlier:
            earlier["protocol"] = None
        same = (earlier["arm"] == plan.arm) & (
            earlier["protocol"].isna() if version is None else earlier["protocol"] == version
        )
        frame = pd.concat([earlier[~same], frame], ignore_index=True)
    csv.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(csv, index=False)
    return values


def tune(
    pipeline: str,
    arm: str,
    *,
    trials: int = DEFAULT_TRIALS,
    top_k: int = 0,
    rerun_seeds: int = 0,
    overrides: Iterable[str] = (),
    commit: str,
    command: str,
    protocol: Any = None,
    config_dir: Path = CONFIGS,
    results_dir: Path = RESULTS,
    sweep_dir: Path | None = None,
    out: Path | None = None,
    dry_run: bool = False,
    keys: Iterable[str] | None = None,
    refine_trials: int = 0,
    radius: float | None = None,
) -> dict:
    """Prepare, run the trials, the second stage's `refine_trials` around the best (`refine_space`,
    of half-width `radius`), the reruns of the top k, write the pick; returns the arm's new tuned
    values. With a `radius` the reruns and the pick keep to stable trials (`stability_guard`). A
    tuning stopped early continues in the same `sweep_dir` (finished runs are kept).
    The pick goes to the recipe's tuned file and results/tuning/ (configs/ and results/ of this
    repository: only from the recipe's own settings), or into `out` (`pick/<arm>.yaml`, which a run
    loads with `--config-dir <out> +pick=<arm>`, and `tuning.csv`), or nowhere (`dry_run`). `keys`
    searches those keys of the space alone."""
    elsewhere = dry_run or out is not None or Path(config_dir).resolve() != CONFIGS.resolve()
    tuning = prepare(
        pipeline, arm, trials=trials, overrides=overrides, config_dir=config_dir, sweep_dir=sweep_dir,
        elsewhere=elsewhere, keys=keys,
    )  # fmt: skip
    if out is not None:
        copy = Path(out) / PICK_GROUP / f"{arm}.yaml"  # the arm's section, the pick to go in it: its other keys kept
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(yaml.safe_dump(read_section(tuning.tuned_file, arm), sort_keys=False))
        tuning = dataclasses.replace(tuning, tuned_file=copy)
    if refine_trials and radius is None:
        raise TuningError("a second stage (--refine-trials) needs --stability-radius: its box's half-width")
    folder = run_trials(tuning, config_dir)
    rows, box = collect(tuning, folder), None
    if refine_trials:
        second, box = run_refinement(tuning, rows, trials=refine_trials, radius=radius, sweep_dir=folder,
                                     config_dir=config_dir)  # fmt: skip
        rows += second
    guard = stability_guard(tuning.space, radius)
    if top_k >= 1:
        candidates = top(rows, tuning.metric, top_k, guard)
        rows += run_reruns(tuning, rows, candidates, seeds=rerun_seeds, sweep_dir=folder, config_dir=config_dir)
    return write_pick(
        tuning, rows, commit=commit, command=command, top_k=top_k if rerun_seeds else 0, protocol=protocol,
        results_dir=results_dir, csv=None if out is None else Path(out) / "tuning.csv", dry_run=dry_run,
        package=out is not None, stability=guard, refined=box,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """`horst-sparse tune`: tune one arm (an optimizer under a recipe) with a fixed trial budget on the
    validation split, and write the pick where the pipelines read it.

    examples, at smoke size (about a minute each on a CPU; from the repository root, as written):

        horst-sparse tune vit adamw --trials 3 --top-k 0 --keys train.base_lr --out outputs/picks/vit experiment=smoke_vit
        python train_vit.py --config-dir outputs/picks/vit +pick=adamw optimizer=adamw experiment=smoke_vit
        horst-sparse tune gpt2 horst --trials 2 --top-k 1 --rerun-seeds 1 --keys optimizer.alpha,optimizer.beta --dry-run experiment=smoke_gpt2

    The first tunes AdamW's learning rate alone: the smoke preset sets the warm-up itself, so a
    warm-up pick would never reach its runs (without --keys the tuning refuses, naming the key). A
    preset changes the recipe's training, so the pick goes to --out DIR, not to the recipe's tuned
    file: DIR/pick/<arm>.yaml, which a run loads with `--config-dir DIR +pick=<arm>` (the second
    line: a smoke run at that lr), and every trial to DIR/tuning.csv. The third runs 2 GPT-2
    trials over HORST's alpha and beta, reruns the better one at one more seed and prints the pick.

    At full size: `horst-sparse tune vit adamw` (16 trials under the embedded digits recipe, each a run
    at 70, 80 and 90 % sparsity; the 3 best rerun at 2 more seeds); on a cluster add
    `hydra/launcher=slurm hydra.sweeper.n_jobs=16`; another recipe: `vit_recipe=deit_imagenet
    data.root=/path/to/imagenet`. The search space is
    configs/hparams_search/<pipeline>_<optimizer>.yaml; any other argument is a Hydra override of
    the runs (recipe, launcher, seed from 100 up). The pick and its provenance go to the arm's
    section of configs/tuned/<pipeline>/<recipe>.yaml, every trial to
    results/tuning/<pipeline>/<recipe>/tuning.csv (docs/design.md §8). Give every arm of a
    comparison the same --trials. Refuses to start from a git tree with uncommitted changes (other
    arms' picks of the pipeline and results/ aside: a study tunes its arms one after another)."""

    from horst_sparse.cli import subcommand, typed
    from horst_sparse.pipeline import names

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = subcommand("tune", main.__doc__)
    parser.add_argument("pipeline", choices=names())
    parser.add_argument("arm", help="an optimizer (adamw, ham, horst) or an arm with values of its own (horst_prunable): "
                        "one with a search space configs/hparams_search/<pipeline>_<arm>.yaml")  # fmt: skip
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help=f"the budget (default {DEFAULT_TRIALS})")
    parser.add_argument(
        "--top-k", type=int, default=DEFAULT_TOP_K, help=f"rerun the k best trials (default {DEFAULT_TOP_K}; 0: none)"
    )
    parser.add_argument(
        "--rerun-seeds",
        type=int,
        default=DEFAULT_RERUN_SEEDS,
        help=f"... at this many more tuning seeds; the pick is the best mean (default {DEFAULT_RERUN_SEEDS})",
    )
    parser.add_argument(
        "--refine-trials", type=int, default=0,
        help="a second stage: this many fresh quasi-random points in a box around the search's best, of half-width "
        "--stability-radius (a log key's box goes past its range's edge); default 0: none",
    )  # fmt: skip
    parser.add_argument(
        "--stability-radius", type=float, metavar="R",
        help="rerun and pick only stable trials: none of whose seeds failed and no failed trial within R (L-infinity, "
        "in the unit cube of the searched ranges); where none is, the pick is flagged",
    )  # fmt: skip
    parser.add_argument("--protocol", type=Path, help="the study protocol file the tuning belongs to (its rows say so)")
    parser.add_argument(
        "--sweep-dir", type=Path, help="the trials' folder (default: a new one); the same again continues a tuning"
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write the pick (DIR/pick/<arm>.yaml) and its trials (DIR/tuning.csv), not into configs/tuned/ and "
        "results/tuning/ (needed where overrides change the recipe's training, e.g. a smoke preset); a run loads "
        "it with --config-dir DIR +pick=<arm>",
    )
    parser.add_argument("--dry-run", action="store_true", help="run the trials and print the pick; write nothing")
    parser.add_argument(
        "--keys",
        metavar="KEY[,KEY]",
        type=lambda text: [key for key in text.split(",") if key],
        help="search these keys of the space alone (e.g. train.base_lr); the others keep the run's values",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of every trial, e.g. hydra/launcher=slurm")
    args = parser.parse_intermixed_args(argv)  # `--trials 8` before or after the overrides
    try:
        commit = require_clean_tree(tuning=(args.pipeline, args.arm))
        from horst_sparse.study.protocol import ProtocolError, load

        try:
            protocol = load(args.protocol) if args.protocol else None
        except (ProtocolError, OSError) as error:
            raise TuningError(f"--protocol: {error}") from None
        values = tune(
            args.pipeline,
            args.arm,
            trials=args.trials,
            top_k=min(args.top_k, args.trials),
            rerun_seeds=args.rerun_seeds,
            overrides=args.overrides,
            protocol=protocol,
            sweep_dir=args.sweep_dir.resolve() if args.sweep_dir else None,
            out=args.out.resolve() if args.out else None,
            dry_run=args.dry_run,
            keys=args.keys,
            refine_trials=args.refine_trials,
            radius=args.stability_radius,
            commit=commit,
            command=typed("tune", argv),
        )
    except RunError as error:
        sys.exit(f"error: {error}")
    pick = values["provenance"]["pick"]
    if flag := (values["provenance"].get("stability") or {}).get("flag"):
        print(f"warning: the pick is flagged unstable ({flag})", file=sys.stderr)
    for edge in values["provenance"]["edges"]:
        print(
            f"warning: the pick has {edge} of its range (outer {EDGE:.0%}): widen the range in "
            f"configs/hparams_search/ and retune; a study refuses an edge it has not declared",
            file=sys.stderr,
        )
    where = (
        "nothing written (--dry-run)"
        if args.dry_run
        else f"written to {values['provenance']['tuning_csv']} and {args.out or 'the arm' + chr(39) + 's tuned file'}"
    )
    print(f"pick: trial {pick['trial']}, {values['provenance']['metric']} {pick['score']:.4g}; {where}")
    if args.dry_run:
        print(yaml.safe_dump({k: v for k, v in values.items() if k != "provenance"}, sort_keys=False), end="")
