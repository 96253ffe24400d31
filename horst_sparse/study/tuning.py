"""Tuning an arm (an optimizer, or an arm with values of its own, under one recipe) with a fixed
budget, on the validation split.

`tune()` is what `scripts/tune.py` runs: quasi-random search over the arm's search space
(`configs/hparams_search/<pipeline>_<optimizer>.yaml`) through Hydra's multirun with
hydra-optuna-sweeper, so any Hydra launcher (local, submitit/SLURM) runs the trials. Every
trial trains at a tuning seed (100 and up; reporting seeds are below) and is scored on
`eval_split=validation`; the test split is never read. The pick goes where the pipelines read
their tuned values, the arm's file `configs/tuned/<pipeline>/<recipe>/<optimizer>.yaml`,
with its provenance (commit, space, sampler, trials, seeds, scores); every trial is a row of
`results/tuning/<pipeline>/<recipe>/tuning.csv`.

`check_equal_budgets()` is the study's guard that the arms of one comparison were tuned
alike: same trial count, same tuning seeds, none of them a reporting seed, all on validation.
"""

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

import numpy as np
import yaml

with (
    warnings.catch_warnings()
):  # optuna 2.10 (hydra-optuna-sweeper's pin) names SQLAlchemy's pre-2.0 API; unused in memory
    warnings.simplefilter("ignore", DeprecationWarning)
    import optuna
from omegaconf import OmegaConf

from horst_sparse.compose import VERSION_BASE, ComposeError, compose_in_context, hydra_context
from horst_sparse.paths import CONFIGS
from horst_sparse.paths import REPO as ROOT
from horst_sparse.paths import RESULTS as RESULTS_ROOT
from horst_sparse.pipeline import Pipeline, TuningScore, UnknownPipeline
from horst_sparse.pipeline import get as get_pipeline
from horst_sparse.pipeline import of as pipeline_of
from horst_sparse.training.config import RunError
from horst_sparse.training.run_log import FAILED_FILE, SUMMARY_FILE, git_commit

RESULTS = RESULTS_ROOT / "tuning"
TUNING_SEEDS_START = 100  # tuning seeds are 100, 101, ...; a study reports on seeds below (0-9)
DEFAULT_TRIALS = 16
EVAL_SPLIT = "validation"


class TuningError(RunError):
    """A tuning that cannot start or whose result cannot be used; one line, with the fix."""


class BudgetError(TuningError):
    """The arms of one comparison were not tuned alike."""


# ---- the score a trial returns to the sweeper -------------------------------------------------


def validation_score(pipeline: Pipeline, summary: Mapping[str, Any]) -> float:
    """The trial's score from its run summary (the pipeline's `tuning.score`); a failed run (no
    summary) and a non-finite score count as the worst."""
    metric = pipeline.tuning
    if not summary or summary.get("status") == "failed":
        return metric.worst()
    if summary.get("eval_split") != EVAL_SPLIT:
        raise TuningError(
            f"a tuning trial was scored on eval_split={summary.get('eval_split')}; tuning reads validation only"
        )
    try:
        score = metric.score(summary)
    except RunError as error:
        raise TuningError(str(error)) from None
    return score if score is not None and math.isfinite(score) else metric.worst()


def trial(cfg) -> float:
    """A pipeline's run as a trial: the sweeper gets its score. Module-level, so that submitit
    pickles it by reference."""
    from horst_sparse.training.runner import hydra_task

    pipeline = pipeline_of(cfg)
    return validation_score(pipeline, hydra_task(pipeline.run, cfg))


# ---- quasi-random search ---------------------------------------------------------------------


class SobolSampler(optuna.samplers.BaseSampler):
    """Quasi-random search: trial n takes point n of a scrambled Sobol sequence
    (`scipy.stats.qmc.Sobol`), one coordinate per parameter in the order the sweeper first asks
    for them (the order of `hydra.sweeper.params`). The points do not depend on any score, so
    batches of trials launched in parallel get the same points as one by one.

    This is what optuna's `QMCSampler` does; hydra-optuna-sweeper 1.3 pins optuna < 3, which
    does not have it."""

    MAX_DIMENSIONS = 32

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._dimensions: dict[str, int] = {}
        self._points = np.empty((0, self.MAX_DIMENSIONS))

    def infer_relative_search_space(self, study, trial) -> dict:
        return {}

    def sample_relative(self, study, trial, search_space) -> dict:
        return {}

    def point(self, number: int) -> np.ndarray:
        """Point `number` of the sequence, in [0, 1) per coordinate."""
        from scipy.stats import qmc

        if number >= len(self._points):  # the sequence's first 2^m points, m as small as it can be
            m = max(1, math.ceil(math.log2(number + 1)))
            self._points = qmc.Sobol(self.MAX_DIMENSIONS, scramble=True, seed=self.seed).random_base2(m)
        return self._points[number]

    def sample_independent(self, study, trial, param_name: str, param_distribution) -> Any:
        dimension = self._dimensions.setdefault(param_name, len(self._dimensions))
        if dimension >= self.MAX_DIMENSIONS:
            raise TuningError(f"a search space has more than {self.MAX_DIMENSIONS} parameters")
        return from_unit(float(self.point(trial.number)[dimension]), param_distribution)


def from_unit(u: float, distribution) -> Any:
    """The value at quantile `u` in [0, 1) of an optuna distribution."""
    d = optuna.distributions

    def bin_of(count: int) -> int:
        return min(int(u * count), count - 1)

    if isinstance(distribution, d.CategoricalDistribution):
        return distribution.choices[bin_of(len(distribution.choices))]
    if isinstance(distribution, d.IntLogUniformDistribution):
        low, high = math.log(distribution.low), math.log(distribution.high + 1)
        return min(int(math.exp(low + u * (high - low))), distribution.high)
    if isinstance(distribution, d.IntUniformDistribution):
        return (
            distribution.low
            + bin_of((distribution.high - distribution.low) // distribution.step + 1) * distribution.step
        )
    if isinstance(distribution, d.DiscreteUniformDistribution):
        steps = round((distribution.high - distribution.low) / distribution.q)
        return distribution.low + bin_of(steps + 1) * distribution.q
    if isinstance(distribution, d.LogUniformDistribution):
        low, high = math.log(distribution.low), math.log(distribution.high)
        return math.exp(low + u * (high - low))
    if isinstance(distribution, d.UniformDistribution):
        return distribution.low + u * (distribution.high - distribution.low)
    raise TuningError(f"the search space uses {type(distribution).__name__}, which the Sobol sampler does not support")


# ---- one arm's tuning ------------------------------------------------------------------------


@dataclasses.dataclass
class Tuning:
    """What a tuning will do, from the composed config, checked before any trial."""

    pipeline: str
    arm: str  # the optimizer tuned
    recipe: str
    arm_file: Path  # configs/tuned/<pipeline>/<recipe>/<arm>.yaml: where the pick goes
    space: dict[str, str]  # dotted key: the sweeper's distribution
    seed: int
    trials: int
    arguments: list[str]  # the multirun's command line

    @property
    def metric(self) -> TuningScore:
        return get_pipeline(self.pipeline).tuning


def require_clean_tree(root: Path | None = None, *, tuning: tuple[str, str] | None = None) -> str:
    """The commit of a clean git tree (this repository's unless `root`), or a one-line
    `TuningError`: a pick must name the code that made it. With `tuning=(pipeline, optimizer)`
    the other optimizers' picks of that pipeline (configs/tuned/<pipeline>/<recipe>/<other>.yaml)
    and results/ (the tuning records, a study's tables) may be uncommitted: a study tunes its arms
    one after another, and an arm's trials read only its own file and no result."""
    root = ROOT if root is None else root
    commit = git_commit(root)
    if commit == "unknown":
        raise TuningError(f"{root} is not a git repository: a pick records the commit it was made at")
    changed = subprocess.run(
        ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True
    ).stdout.splitlines()
    if tuning is not None:
        pipeline, optimizer = tuning
        others = f"configs/tuned/{pipeline}/"

        def allowed(path: str) -> bool:
            inside = path.startswith(others) and path.count("/") == 4 and not path.endswith(f"/{optimizer}.yaml")
            return inside or path.startswith("results/")

        changed = [line for line in changed if not allowed(line[3:].strip())]
    if changed:
        raise TuningError(
            f"the git tree at {root} has uncommitted changes ({changed[0].strip()}, ...): commit or stash them "
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
) -> Tuning:
    """Compose the tuning's config and check that its pick can reach a run: every searched key
    reads the arm's tuned file, the seed is a tuning seed, the split is validation. An arm is an
    optimizer (the runs that select it read its values) or an arm of configs/arm/ with values of
    its own (`tuned_as: <arm>`, e.g. horst_prunable)."""
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
    from hydra.core.override_parser.overrides_parser import OverridesParser

    registered.register_configs()
    arguments = [f"+hparams_search={pipeline}_{arm}", *overrides]
    parsed = OverridesParser.create().parse_overrides(
        list(overrides)
    )  # a sweep on the command line replaces the YAML's
    searched = {o.key_or_group: o.input_line.split("=", 1)[1] for o in parsed if o.is_sweep_override()}
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
    arm_choice = choices.get(f"tuned/{pipeline}/{recipe}@tuned.{arm}")
    if arm_choice is None:
        raise TuningError(f"the {recipe} recipe has no tuned file for {arm} (configs/tuned/{pipeline}/{recipe}.yaml)")
    if cfg.seed < TUNING_SEEDS_START:
        raise TuningError(f"seed={cfg.seed}: tuning seeds start at {TUNING_SEEDS_START} (reporting seeds are below it)")
    if cfg.get("eval_split") != EVAL_SPLIT:
        raise TuningError(f"eval_split={cfg.get('eval_split')}: tuning scores on the validation split only")
    space = {**{str(k): str(v) for k, v in cfg.hydra.sweeper.params.items()}, **searched}
    tuned = OmegaConf.to_container(cfg.tuned[arm], resolve=False)
    for key in space:
        leaf = key.rsplit(".", 1)[-1]
        wire = OmegaConf.to_container(OmegaConf.select(cfg, key.rsplit(".", 1)[0]), resolve=False).get(leaf)
        # the optimizer's YAML and the recipe read the entry of the run's `tuned_as` (docs/design.md §7)
        reads = {f"${{tuned.{arm}.{leaf}}}", f"${{tuned.${{tuned_as}}.{leaf}}}"}
        if cfg.optimizer.name == arm:  # a recipe written before `tuned_as` reads the optimizer's entry
            reads.add(f"${{tuned.${{optimizer.name}}.{leaf}}}")
        if leaf not in tuned or wire not in reads:
            raise TuningError(
                f"{search.name} searches {key}, which the run does not read from tuned.{arm}.{leaf} "
                f"(it is {wire!r}): the pick would never reach a run"
            )
    if sweep_dir is None:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        sweep_dir = ROOT / "multirun" / "tuning" / f"{pipeline}_{recipe}_{arm}" / stamp
    arguments += [
        f"hydra.sweeper.n_trials={trials}",
        f"hydra.sweeper.direction={registered.tuning.direction}",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    return Tuning(
        pipeline,
        arm,
        recipe,
        config_dir / "tuned" / pipeline / recipe / f"{arm_choice}.yaml",
        space,
        int(cfg.seed),
        trials,
        arguments,
    )


def run_trials(plan: Tuning, config_dir: Path = CONFIGS) -> Path:
    """The multirun, through Hydra's own command line (sweeper and launcher as configured)."""
    import hydra

    registered = get_pipeline(plan.pipeline)
    registered.register_configs()
    main = hydra.main(config_path=str(config_dir), config_name=registered.config_name, version_base=VERSION_BASE)(trial)
    sweep_dir = Path(next(a.split("=", 1)[1] for a in plan.arguments if a.startswith("hydra.sweep.dir=")))
    argv = sys.argv
    sys.argv = [registered.script, "-m", *plan.arguments]
    try:
        main()
    except SystemExit as exit:
        # the runner ends a multirun with failed cells by exiting non-zero, after listing them;
        # in a tuning a failed trial (a diverged lr) is a result: collect() scores it worst
        if not any(sweep_dir.glob(f"*/{FAILED_FILE}")):
            raise
        print(f"{exit.code}: they score worst in this tuning", file=sys.stderr)
    finally:
        sys.argv = argv
    return sweep_dir


def collect(plan: Tuning, sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per trial, from the trial folders (each has Hydra's overrides and the run's
    summary or failure record), in trial order."""
    import json

    rows = []
    for folder in sorted(
        (p for p in sweep_dir.iterdir() if (p / ".hydra" / "overrides.yaml").is_file()),
        key=lambda p: int(p.name.split("_", 1)[0]),
    ):
        overrides = dict(o.split("=", 1) for o in yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()))
        config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
        summary_file = folder / SUMMARY_FILE  # a failed trial has the runner's failed.json instead
        failed = not summary_file.is_file()
        summary = {} if failed else json.loads(summary_file.read_text())
        row = {
            "pipeline": plan.pipeline,
            "recipe": plan.recipe,
            "arm": plan.arm,
            "trial": int(folder.name.split("_", 1)[0]),
            "seed": int(config["seed"]),
        }
        row.update({key: yaml.safe_load(overrides[key]) for key in plan.space})
        row.update(
            eval_split=config.get("eval_split"),
            metric=plan.metric.description,
            score=validation_score(get_pipeline(plan.pipeline), {} if failed else summary),
            status="failed" if failed else "finished",
        )
        rows.append(row)
    if len(rows) != plan.trials:
        raise TuningError(f"{sweep_dir} has {len(rows)} finished trial folders, not the {plan.trials} planned")
    return rows


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


def best(rows: list[dict[str, Any]], metric: TuningScore) -> dict[str, Any]:
    """The best trial; the earlier one of a tie."""
    sign = 1 if metric.direction == "maximize" else -1
    return max(rows, key=lambda r: (sign * r["score"], -r["trial"]))


def write_pick(
    plan: Tuning, rows: list[dict[str, Any]], *, commit: str, command: str, results_dir: Path = RESULTS
) -> dict:
    """The arm's tuned file with the pick and its provenance (the keys outside the search space
    kept), and the arm's rows of tuning.csv replaced."""
    import pandas as pd

    pick = best(rows, plan.metric)
    if not math.isfinite(pick["score"]):
        raise TuningError(f"every trial of {plan.arm} failed; nothing to pick (see the trial folders)")
    csv = results_dir / plan.pipeline / plan.recipe / "tuning.csv"
    values = yaml.safe_load(plan.arm_file.read_text())
    for key in plan.space:
        values[key.rsplit(".", 1)[-1]] = pick[key]
    values["provenance"] = {
        "made_by": command,
        "commit": commit,
        "date": datetime.date.today().isoformat(),
        "sampler": "horst_sparse.study.tuning.SobolSampler (scrambled Sobol, hydra-optuna-sweeper)",
        "space": plan.space,
        "trials": len(rows),
        "seeds": sorted({r["seed"] for r in rows}),
        "eval_split": EVAL_SPLIT,
        "metric": plan.metric.description,
        "direction": plan.metric.direction,
        "scores": [r["score"] for r in rows],
        "pick": {"trial": pick["trial"], "score": pick["score"]},
        "edges": edges(plan.space, pick),
        "tuning_csv": str(csv.relative_to(ROOT) if csv.is_relative_to(ROOT) else csv),
    }
    header = (
        f"# {plan.arm} under the {plan.pipeline} {plan.recipe} recipe: the pick of {len(rows)} quasi-random trials on the\n"
        f"# validation split, written by `{command}` at commit {commit}\n"
        "# (every trial: provenance.tuning_csv). Keys outside the search space are kept from before.\n"
    )
    plan.arm_file.write_text(header + yaml.safe_dump(values, sort_keys=False))
    frame = pd.DataFrame([{**r, "pick": r["trial"] == pick["trial"], "commit": commit} for r in rows])
    if csv.is_file():
        earlier = pd.read_csv(csv)
        frame = pd.concat([earlier[earlier["arm"] != plan.arm], frame], ignore_index=True)
    csv.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(csv, index=False)
    return values


def tune(
    pipeline: str,
    arm: str,
    *,
    trials: int = DEFAULT_TRIALS,
    overrides: Iterable[str] = (),
    commit: str,
    command: str,
    config_dir: Path = CONFIGS,
    results_dir: Path = RESULTS,
    sweep_dir: Path | None = None,
) -> dict:
    """Prepare, run the trials, write the pick; returns the arm's new tuned values."""
    tuning = prepare(pipeline, arm, trials=trials, overrides=overrides, config_dir=config_dir, sweep_dir=sweep_dir)
    rows = collect(tuning, run_trials(tuning, config_dir))
    return write_pick(tuning, rows, commit=commit, command=command, results_dir=results_dir)


# ---- the study's guard -----------------------------------------------------------------------


def check_equal_budgets(
    tuned: Mapping[str, Any], arms: Iterable[str], reporting_seeds: Iterable[int], declared_edges: Iterable[str] = ()
) -> None:
    """Refuse a comparison whose tuned `arms` were not tuned alike, one line naming the arm:
    each must have been tuned by horst-tune (`tuned.<arm>.provenance`), on the validation
    split, with the same number of trials and the same tuning seeds, none of them a reporting
    seed, over nested search spaces (the keys every arm searches over the same ranges, one arm
    searching those alone: the others add only their own), with no pick at the edge of its range
    unless `declared_edges` names it (`<arm> <key>`). `tuned` is a run's composed `tuned` node
    (or its container)."""
    if OmegaConf.is_config(tuned):
        tuned = OmegaConf.to_container(tuned, resolve=True)
    reporting = set(reporting_seeds)
    records = {}
    for arm in arms:
        record = (tuned.get(arm) or {}).get("provenance")
        if not record:
            raise BudgetError(
                f"arm {arm} was not tuned by scripts/tune.py (tuned.{arm}.provenance is empty): "
                f"run horst-tune <pipeline> {arm}"
            )
        if record["eval_split"] != EVAL_SPLIT:
            raise BudgetError(f"arm {arm} was tuned on eval_split={record['eval_split']}; retune it on validation")
        overlap = sorted(reporting & set(record["seeds"]))
        if overlap:
            raise BudgetError(
                f"arm {arm} was tuned on reporting seeds {overlap}; tune on seeds from {TUNING_SEEDS_START} up"
            )
        records[arm] = record
    if len({r["trials"] for r in records.values()}) > 1:
        counts = ", ".join(f"{arm} {r['trials']}" for arm, r in records.items())
        raise BudgetError(f"unequal tuning budgets (trials: {counts}); retune with the same --trials")
    if len({tuple(r["seeds"]) for r in records.values()}) > 1:
        seeds = ", ".join(f"{arm} {r['seeds']}" for arm, r in records.items())
        raise BudgetError(f"arms tuned on different seeds ({seeds}); retune with the same seed")
    check_nested_spaces({arm: r["space"] for arm, r in records.items()})
    for arm, record in records.items():
        undeclared = [
            e for e in record.get("edges", []) if f"{arm} {e.split(' at the ')[0]}" not in set(declared_edges)
        ]
        if undeclared:
            raise BudgetError(
                f"arm {arm}'s pick has {', '.join(undeclared)} of its range: widen the range in "
                "configs/hparams_search/ and retune, or declare the edge in the study's protocol"
            )


def check_nested_spaces(spaces: Mapping[str, Mapping[str, str]]) -> None:
    """The arms searched nested spaces: the keys they share over the same ranges, and one arm
    (AdamW's) searching those alone, so that every other arm adds only its own keys."""
    shared = set.intersection(*(set(space) for space in spaces.values())) if spaces else set()
    for key in sorted(shared):
        ranges = {arm: space[key] for arm, space in spaces.items()}
        if len(set(ranges.values())) > 1:
            shown = "; ".join(f"{arm} {value}" for arm, value in ranges.items())
            raise BudgetError(f"the arms searched {key} over different ranges ({shown}); retune over one shared space")
    if len(spaces) > 1 and not any(set(space) == shared for space in spaces.values()):
        shown = "; ".join(f"{arm}: {', '.join(space)}" for arm, space in spaces.items())
        raise BudgetError(
            f"the arms searched different shared hyperparameters ({shown}): each must search the pipeline's shared "
            "space (configs/hparams_search/<pipeline>.yaml) and add only its own keys; retune"
        )


def main(argv: list[str] | None = None) -> None:
    """`horst-tune` (scripts/tune.py): tune one arm (an optimizer under a recipe) with a fixed trial
    budget on the validation split, and write the pick where the pipelines read it.

        horst-tune vit adamw                          # 16 quasi-random trials, embedded digits recipe
        horst-tune gpt2 horst --trials 32 hydra/launcher=slurm hydra.sweeper.n_jobs=32
        horst-tune vit horst vit_recipe=deit_imagenet data.root=/path/to/imagenet hydra/launcher=slurm

    The search space is configs/hparams_search/<pipeline>_<optimizer>.yaml; any other argument is
    a Hydra override of the runs (recipe, launcher, seed from 100 up). The pick and its provenance
    go to configs/tuned/<pipeline>/<recipe>/<optimizer>.yaml, every trial to
    results/tuning/<pipeline>/<recipe>/tuning.csv (docs/design.md §8). Give every arm of a
    comparison the same --trials. Refuses to start from a git tree with uncommitted changes (other
    arms' picks of the pipeline and results/ aside: a study tunes its arms one after another)."""
    import argparse
    import shlex

    from horst_sparse.pipeline import names

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="horst-tune",
        description=(main.__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(main.__doc__ or "").split("\n\n", 1)[1],
    )
    parser.add_argument("pipeline", choices=names())
    parser.add_argument("arm", help="an optimizer (adamw, ham, horst) or an arm with values of its own (horst_prunable): "
                        "one with a search space configs/hparams_search/<pipeline>_<arm>.yaml")  # fmt: skip
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help=f"the budget (default {DEFAULT_TRIALS})")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of every trial, e.g. hydra/launcher=slurm")
    args = parser.parse_intermixed_args(argv)  # `--trials 8` before or after the overrides
    try:
        commit = require_clean_tree(tuning=(args.pipeline, args.arm))
        values = tune(
            args.pipeline,
            args.arm,
            trials=args.trials,
            overrides=args.overrides,
            commit=commit,
            command=shlex.join(["python", "scripts/tune.py", *argv]),
        )
    except RunError as error:
        sys.exit(f"error: {error}")
    pick = values["provenance"]["pick"]
    for edge in values["provenance"]["edges"]:
        print(
            f"warning: the pick has {edge} of its range (outer {EDGE:.0%}): widen the range in "
            f"configs/hparams_search/ and retune; a study refuses an edge it has not declared",
            file=sys.stderr,
        )
    print(
        f"pick: trial {pick['trial']}, {values['provenance']['metric']} {pick['score']:.4g}; "
        f"written to {values['provenance']['tuning_csv']} and the arm's tuned file"
    )
