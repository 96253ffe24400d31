"""Nested search spaces: every arm searches its pipeline's shared space (lr, weight
decay, warm-up, the same ranges) first and adds only its own keys; HORST's space reaches AdamW;
a study refuses arms whose searches differ and picks at the edge of a range."""

from __future__ import annotations

import pytest
import torch

import horst
from horst_sparse.compose import compose
from horst_sparse.paths import CONFIGS
from horst_sparse.pipeline import get, names
from horst_sparse.study.budget import BudgetError, check_equal_budgets, check_nested_spaces, edge_declared
from horst_sparse.tune import edges, position


def space(pipeline: str, optimizer: str) -> dict[str, str]:
    """The sweeper's params as `horst-sparse tune <pipeline> <optimizer>` composes them, in order."""
    config = compose(get(pipeline), [f"+hparams_search={pipeline}_{optimizer}"], hydra_node=True)
    return {str(k): str(v) for k, v in config.hydra.sweeper.params.items()}


ARMS = sorted(
    (p, f.stem.removeprefix(f"{p}_")) for p in names() for f in (CONFIGS / "hparams_search").glob(f"{p}_*.yaml")
)


@pytest.mark.parametrize("pipeline", names())
def test_every_arm_searches_the_shared_space_first_and_adds_only_its_own(pipeline):
    shared = space(pipeline, "adamw")
    assert len(shared) == 3 and any("lr" in k for k in shared) and "optimizer.weight_decay" in shared
    for _, optimizer in (arm for arm in ARMS if arm[0] == pipeline):
        mine = space(pipeline, optimizer)
        assert list(mine.items())[: len(shared)] == list(shared.items()), optimizer  # the Sobol coordinates 0-2
        assert all(k.startswith("optimizer.") for k in list(mine)[len(shared) :]), optimizer  # its own, not shared


@pytest.mark.parametrize("pipeline", names())
@pytest.mark.parametrize("optimizer", ["horst", "ham"])
def test_a_mirror_arms_space_reaches_adamw(pipeline, optimizer):
    """At the lower corner of HORST's (HAM's) own keys, it trains the weights AdamW trains, within
    1 % (300 steps of least squares at the ends and the middle of the shared lr range): the space
    holds AdamW, so a tuning cannot favour the arm by leaving AdamW's point out, nor cut the arm off
    from it (v3's HAM alpha range began at 1, 10 % away from AdamW; protocol v4 widened it)."""
    mine = space(pipeline, optimizer)
    mirror = {"horst": horst.HORST, "ham": horst.HAM}[optimizer]
    alpha, beta = (float(mine[f"optimizer.{k}"].split("interval(")[1].split(",")[0]) for k in ("alpha", "beta"))
    lr_range = next(v for k, v in mine.items() if k.endswith("lr"))
    low, high = (float(x) for x in lr_range.split("interval(")[1].rstrip(")").split(","))
    for lr in (low, (low * high) ** 0.5, high):
        torch.manual_seed(0)
        adamw_weight = torch.nn.Parameter(torch.randn(8, 16) * 0.3)
        mirror_weight = torch.nn.Parameter(adamw_weight.detach().clone())
        x = torch.randn(512, 16)
        y = x @ torch.randn(16, 8)
        optimizers = (
            (adamw_weight, torch.optim.AdamW([adamw_weight], lr=lr, weight_decay=0.05)),
            (mirror_weight, mirror([mirror_weight], lr=lr, weight_decay=0.05, alpha=alpha, beta=beta)),
        )
        for _ in range(300):
            for weight, stepper in optimizers:
                stepper.zero_grad()
                ((x @ weight.T - y) ** 2).mean().backward()
                stepper.step()
        assert (adamw_weight - mirror_weight).norm() / adamw_weight.norm() < 0.01, lr


def test_a_pick_in_the_outer_five_percent_of_its_range_is_an_edge():
    ranges = {"train.lr": "tag(log, interval(3.0e-4, 1.0e-2))", "train.warmup_steps": "int(interval(0, 100))"}
    assert position(1e-3, ranges["train.lr"]) == pytest.approx(0.3434, abs=1e-4)  # in log scale
    assert edges(ranges, {"train.lr": 0.00906, "train.warmup_steps": 50}) == ["train.lr at the upper edge"]
    assert edges(ranges, {"train.lr": 1e-3, "train.warmup_steps": 2}) == ["train.warmup_steps at the lower edge"]
    assert edges(ranges, {"train.lr": 1e-3, "train.warmup_steps": 50}) == []


def _record(space: dict[str, str], edges: list[str] = ()) -> dict:
    return {
        "provenance": {"eval_split": "validation", "seeds": [100], "trials": 16, "space": space, "edges": list(edges)}
    }


SHARED = {"train.lr": "tag(log, interval(3e-4, 2e-2))", "optimizer.weight_decay": "tag(log, interval(1e-3, 1.0))"}


def test_nested_spaces_pass_and_others_are_refused_naming_what_differs():
    horst_space = {**SHARED, "optimizer.alpha": "tag(log, interval(1e-2, 30.0))"}
    check_equal_budgets({"adamw": _record(SHARED), "horst": _record(horst_space)}, ["adamw", "horst"], [0])
    narrower = {**horst_space, "train.lr": "tag(log, interval(3e-4, 1e-2))"}
    with pytest.raises(BudgetError, match=r"searched train.lr over different ranges \(adamw tag"):
        check_nested_spaces({"adamw": SHARED, "horst": narrower})
    other = {"train.lr": SHARED["train.lr"], "optimizer.alpha": "tag(log, interval(1.0, 30.0))"}
    with pytest.raises(BudgetError, match=r"searched different shared hyperparameters \(adamw: train.lr, optimizer"):
        check_nested_spaces({"adamw": SHARED, "horst": other})


def test_an_edge_pick_is_refused_unless_declared():
    tuned = {"adamw": _record(SHARED, ["train.lr at the upper edge"]), "horst": _record(SHARED)}
    with pytest.raises(BudgetError, match=r"arm adamw's pick has train.lr at the upper edge of its range: widen"):
        check_equal_budgets(tuned, ["adamw", "horst"], [0])
    check_equal_budgets(tuned, ["adamw", "horst"], [0], declared_edges=["adamw train.lr"])
    check_equal_budgets(tuned, ["adamw", "horst"], [0], declared_edges=["adamw train.lr at the upper edge"])
    with pytest.raises(BudgetError, match="train.lr at the upper edge"):  # a declared side is that side only
        check_equal_budgets(tuned, ["adamw", "horst"], [0], declared_edges=["adamw train.lr at the lower edge"])


@pytest.mark.parametrize("pipeline,recipe", [("vit", "mnist1d"), ("gpt2", "pydoc")])
def test_the_committed_picks_pass_only_where_tuned_alike_under_the_current_protocol(pipeline, recipe):
    """Picks of protocol v1/v2 (AdamW searched lr, decay and warm-up; HORST and HAM lr, alpha and
    beta at hand-set decay and warm-up: equal trial counts, unequal searches) are refused; picks
    made under a registered protocol from v3 on (nested spaces, one budget) pass, at its reporting
    seeds and the current protocol's declared edges. (Which version's picks a study runs at is the
    study's to ask: budget.tunings, tests/test_embedded_study.py.)"""
    from horst_sparse.study import protocol

    current = protocol.versions("embedded")[-1]
    config = compose(get(pipeline), [f"{get(pipeline).recipe_group}={recipe}"])
    arms = ["adamw", "ham", "horst"]
    made = {a: ((config.tuned[a].provenance or {}).get("protocol") or {}).get("version") for a in arms}
    if all(version is not None and version >= 3 for version in made.values()):  # refused only for an undeclared edge
        undeclared = [
            a for a in arms for e in config.tuned[a].provenance.edges if not edge_declared(a, e, current.declared_edges)
        ]
        if undeclared:
            with pytest.raises(BudgetError, match=f"arm {undeclared[0]}'s pick has .* edge of its range"):
                check_equal_budgets(config.tuned, arms, range(10, 20), declared_edges=current.declared_edges)
        else:
            check_equal_budgets(config.tuned, arms, range(10, 20), declared_edges=current.declared_edges)
    else:
        with pytest.raises(BudgetError):
            check_equal_budgets(config.tuned, arms, reporting_seeds=range(10, 20))


def test_an_arm_with_settings_of_its_own_is_tuned_on_its_own():
    """horst_prunable (HORST mirroring only the prunable matrices) gets its own tuning over the
    shared space and HORST's keys, into its own section: not HORST's pick."""
    from horst_sparse.tune import prepare

    planned = prepare("gpt2", "horst_prunable", trials=2)
    assert planned.tuned_file == CONFIGS / "tuned" / "gpt2" / "pydoc.yaml" and planned.arm == "horst_prunable"
    assert list(planned.space)[:3] == list(space("gpt2", "adamw")) and {"optimizer.alpha", "optimizer.beta"} < set(
        planned.space
    )
    config = compose(get("gpt2"), ["+hparams_search=gpt2_horst_prunable"])
    assert config.optimizer.hyperbolic_params == "prunable" and config.tuned_as == "horst_prunable"


def test_an_arm_tuned_on_its_own_runs_at_its_own_values_and_the_study_counts_arms():
    """horst_prunable reads its own tuned values where its own tuning made them (GPT-2), else
    HORST's (the ViT, where the study does not run it); the study's budget counts it as an arm of
    its own and refuses it untuned."""
    from horst_sparse.study import run as study
    from horst_sparse.study.jobs import Job

    for pipeline in ("gpt2", "vit"):
        horst_run, prunable = (compose(get(pipeline), [f"experiment={arm}"]) for arm in ("horst", "horst_prunable"))
        own = prunable.tuned.horst_prunable.provenance is not None
        assert own == (pipeline == "gpt2")
        assert (prunable.optimizer.alpha == horst_run.optimizer.alpha) != own
    jobs = study.study_jobs(["embedded_gpt2"])
    jobs = [j for j in jobs if j.seed == min(j.seed for j in jobs)]
    assert sorted({j.config["tuned_as"] for j in jobs}) == ["adamw", "ham", "horst", "horst_prunable"]
    untuned = [
        Job(**{**j.__dict__, "config": {**j.config, "tuned": {**j.config["tuned"], "horst_prunable": {}}}})
        for j in jobs
    ]
    with pytest.raises(BudgetError, match="arm horst_prunable was not tuned"):
        study.check_budgets(untuned)
