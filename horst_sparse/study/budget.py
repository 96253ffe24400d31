"""The study's guard that the arms of one comparison were tuned alike, and the tunings its protocol's
budget still asks for."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from horst_sparse.paths import REPO
from horst_sparse.pipeline import get as get_pipeline
from horst_sparse.study.jobs import Job, StudyError, by_pipeline
from horst_sparse.study.protocol import tuned_under
from horst_sparse.study.trial import EVAL_SPLIT, TUNING_SEEDS_START, TuningError, cells


class BudgetError(TuningError):
    """The arms of one comparison were not tuned alike."""


def check_equal_budgets(
    tuned: Mapping[str, Any], arms: Iterable[str], reporting_seeds: Iterable[int], declared_edges: Iterable[str] = ()
) -> None:
    """Refuse, naming the arm, a comparison whose `arms` (a run's composed `tuned` node) were not tuned
    alike: each by horst-sparse tune on validation with the same trials, seeds (none a reporting seed),
    reruns and cells, over nested spaces with no key left out (--keys) that another searched, and no
    pick at the edge of its range but the `declared_edges`."""
    if OmegaConf.is_config(tuned):
        tuned = OmegaConf.to_container(tuned, resolve=True)
    records = {}
    for arm in arms:
        record = (tuned.get(arm) or {}).get("provenance")
        if not record:
            raise BudgetError(
                f"arm {arm} was not tuned by horst-sparse tune (tuned.{arm}.provenance is empty): "
                f"run horst-sparse tune <pipeline> {arm}"
            )
        if record["eval_split"] != EVAL_SPLIT:
            raise BudgetError(f"arm {arm} was tuned on eval_split={record['eval_split']}; retune it on validation")
        if overlap := sorted(set(reporting_seeds) & set(record["seeds"])):
            raise BudgetError(
                f"arm {arm} was tuned on reporting seeds {overlap}; tune on seeds from {TUNING_SEEDS_START} up"
            )
        records[arm] = record
    for problem, shown, fix in (
        ("unequal tuning budgets (trials: {})", lambda r: r["trials"], "with the same --trials"),
        ("arms tuned on different seeds ({})", lambda r: r["seeds"], "with the same seed"),
        ("unequal reruns of the best trials ({})", lambda r: f"top {r.get('top_k', 0)} at seeds "
         f"{list(r.get('rerun_seeds') or ())}", "with the same --top-k and --rerun-seeds"),
        ("the arms were scored on different cells (tune_over: {})", lambda r: r.get("tune_over"), "over one shared space"),
        ("unequal second stages ({})", lambda r: (r.get("refine") or {}).get("trials", 0), "with the same --refine-trials"),
        ("unequal stability guards (radius {})", lambda r: (r.get("stability") or {}).get("radius"),
         "with the same --stability-radius"),
        ("arms tuned on different engines ({})", lambda r: r.get("engine", "reference"), "on one engine"),
    ):  # fmt: skip
        each = {arm: shown(r) for arm, r in records.items()}
        if len({yaml.safe_dump(v) for v in each.values()}) > 1:
            raise BudgetError(f"{problem.format(', '.join(f'{a} {v}' for a, v in each.items()))}; retune {fix}")
    check_nested_spaces({arm: r["space"] for arm, r in records.items()})
    for arm, record in records.items():
        for other, theirs in records.items():
            if both := [key for key in record.get("left_out") or () if key in theirs["space"]]:
                raise BudgetError(
                    f"arm {arm} was tuned without searching {', '.join(both)} (--keys), which {other} searched; "
                    "retune them over the same keys"
                )
        # a second stage refined the pick's edges past the range: an edge left after it is flagged in its
        # provenance, not refused (no range to widen that the protocol did not already fix)
        undeclared = [e for e in record.get("edges", []) if not edge_declared(arm, e, declared_edges)]
        if undeclared and not record.get("refine"):
            raise BudgetError(
                f"arm {arm}'s pick has {', '.join(undeclared)} of its range: widen the range in "
                "configs/hparams_search/ and retune, or declare the edge in the study's protocol"
            )


def edge_declared(arm: str, edge: str, declared: Iterable[str]) -> bool:
    """Whether a protocol declares the arm's edge pick (`edge`: "optimizer.alpha at the lower
    edge"): as "<arm> <key> at the lower edge" (that side only: the side where the arm turns into
    another, as HAM and HORST into AdamW at the lower corner of alpha) or "<arm> <key>" (either)."""
    key = edge.split(" at the ")[0]
    return bool({f"{arm} {edge}", f"{arm} {key}"} & set(declared))


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


def check_budgets(jobs: Sequence[Job], declared_edges: Sequence[str] = ()) -> None:
    """Per pipeline, check_equal_budgets over every set of tuned values its jobs read (`tuned_as`: an
    optimizer's or an arm's own, so the budget counts arms; a control reads another arm's values),
    and the runs on the engine their picks were tuned on."""
    for group in by_pipeline(jobs).values():
        arms = sorted({j.config["tuned_as"] for j in group})
        check_equal_budgets(group[0].config["tuned"], arms, sorted({j.seed for j in group}), declared_edges)
        for job in group:
            tuned_on = job.provenance().get("engine", "reference")
            if job.config.get("engine", "reference") != tuned_on:
                raise BudgetError(
                    f"{job.run} runs on engine={job.config.get('engine')} at a pick tuned on engine={tuned_on}: "
                    "run it on the engine its arm was tuned on, or retune"
                )


def tunings(protocol: Any, jobs: Sequence[Job], versions: Sequence[Any] = ()) -> list[list[str]]:
    """The `horst-sparse tune` lines the protocol's budget still asks for: each set of tuned values its jobs
    read whose pick was not made under this version. A version that takes an earlier one's tunings
    (`tunings_from`) runs at that version's picks and tunes anew only the arms of its `retune`. A stopped
    tuning continues in its folder, outputs/<study>/v<N>/tuning/<pipeline>/<arm>."""
    earlier = tuned_under(protocol, versions) if versions else protocol
    budget = protocol.tuning
    lines = []
    for pipeline, group in by_pipeline(jobs).items():
        for arm in sorted({j.config["tuned_as"] for j in group}):
            made = (group[0].provenance(arm).get("protocol") or {}).get("version")
            if earlier is not protocol and (pipeline, arm) not in protocol.retuned:
                if made != earlier.version:
                    raise StudyError(
                        f"{protocol.path.name} runs {pipeline} {arm} at v{earlier.version}'s pick, but "
                        f"configs/tuned/ holds none of v{earlier.version}'s: restore it (git log -- configs/tuned)"
                    )
                continue
            if made == protocol.version:
                continue
            folder = Path("outputs") / protocol.study / f"v{protocol.version}" / "tuning" / pipeline / arm
            second = [
                *(["--refine-trials", str(budget["refine_trials"][pipeline])] if "refine_trials" in budget else []),
                *(["--stability-radius", str(budget["stability_radius"])] if "stability_radius" in budget else []),
            ]
            lines.append(
                ["horst-sparse", "tune", pipeline, arm, "--trials", str(budget["trials"][pipeline]),
                 "--top-k", str(budget["top_k"][pipeline]), "--rerun-seeds", str(budget["rerun_seeds"]), *second,
                 "--protocol", str(protocol.path.relative_to(REPO)), "--sweep-dir", str(folder),
                 f"{get_pipeline(pipeline).recipe_group}={group[0].recipe}", *budget["overrides"]]
            )  # fmt: skip
    return lines


def tuning_runs(record: Mapping[str, Any]) -> int:
    """The runs a tuning made (its provenance): every search trial and rerun, one run per cell."""
    per_trial = len(cells(record.get("tune_over")))
    second = (record.get("refine") or {}).get("trials", 0)
    return (
        record.get("trials", 0) + second + record.get("top_k", 0) * len(record.get("rerun_seeds") or [])
    ) * per_trial
