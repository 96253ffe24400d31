"""Tuning as a feature (horst_sparse/tune.py, horst-sparse tune): quasi-random trials through
Hydra's multirun and hydra-optuna-sweeper, scored on the validation split only, the pick
written where the next run reads it, and the equal-budget check a study calls.

The real thing at tiny size: 3 trials of AdamW on the digits ViT (1 block, 4 epochs) through
the basic launcher, in this process (so the test split can be poisoned in place)."""

from __future__ import annotations

import json
import math
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import HORST_SPARSE, ROOT, _subprocess_env

import horst_sparse.vit.data
from horst_sparse import sobol
from horst_sparse import tune as tuning
from horst_sparse.compose import compose
from horst_sparse.pipeline import get
from horst_sparse.study import budget
from horst_sparse.vit.data import DigitsDataset

TINY = (
    "train.epochs=4",
    "acdc.dense_warmup=1",
    "acdc.compressed=1",
    "acdc.decompressed=1",
    "acdc.final_decompressed=1",
    "acdc.final_compressed=1",
    "model.depth=1",
    "logging.mode=disabled",
    "train.warmup_epochs=int(interval(0, 2))",  # a sweep, replacing the YAML's 0-8
    "tune_over=null",  # one run a trial (the search space's: one per reported sparsity; tested below)
)
TRIALS = 3


def _tune(tmp: Path) -> tuple[dict, Path, Path]:
    """AdamW tuned on a copy of configs/ (the pick is written there); returns the new tuned
    values, the configs and the results folder."""
    configs, results = tmp / "configs", tmp / "results"
    shutil.copytree(ROOT / "configs", configs)
    values = tuning.tune(
        "vit",
        "adamw",
        trials=TRIALS,
        overrides=TINY,
        commit="c0ffee",
        command="pytest",
        config_dir=configs,
        results_dir=results,
        sweep_dir=tmp / "sweep",
    )
    return values, configs, results


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    return _tune(tmp_path_factory.mktemp("clean"))


class PoisonedDigits(DigitsDataset):
    """The digits with every test label shifted by one: a model scored on them ranks near zero."""

    def __init__(self, split: str, **kwargs) -> None:
        super().__init__(split, **kwargs)
        if split == "test":
            self.targets = [(t + 1) % 10 for t in self.targets]


def _compose(configs: Path, *overrides: str):
    return compose(get("vit"), overrides, config_dir=configs)


def test_tuning_never_reads_the_test_split(tuned, tmp_path, monkeypatch):
    """With the test split poisoned, every trial scores exactly as before and the pick stays;
    the poison bites: the same model scored on the test split ranks near zero."""
    clean, _, _ = tuned
    monkeypatch.setattr(horst_sparse.vit.data, "DigitsDataset", PoisonedDigits)
    poisoned, configs, _ = _tune(tmp_path)
    assert poisoned["provenance"]["scores"] == clean["provenance"]["scores"]
    assert poisoned["provenance"]["pick"] == clean["provenance"]["pick"]
    assert (poisoned["base_lr"], poisoned["weight_decay"], poisoned["warmup_epochs"]) == (
        clean["base_lr"],
        clean["weight_decay"],
        clean["warmup_epochs"],
    )

    from horst_sparse.vit.run import run

    picked = [o for o in TINY if "interval" not in o]
    summary = run(_compose(configs, "optimizer=adamw", "eval_split=test", *picked), run_dir=tmp_path / "on_test")
    assert summary["eval_split"] == "test"
    assert summary["top1"] < 0.2 < clean["provenance"]["pick"]["score"]  # reading test would change every score


def test_the_written_pick_is_what_the_next_run_composes(tuned):
    values, configs, results = tuned
    cfg = _compose(configs, "optimizer=adamw")
    assert cfg.train.base_lr == values["base_lr"] and cfg.train.warmup_epochs == values["warmup_epochs"]
    assert cfg.optimizer.weight_decay == values["weight_decay"] and cfg.optimizer.betas == [0.9, 0.999]  # kept
    horst = _compose(configs, "optimizer=horst")
    assert horst.train.base_lr == 3e-3 and horst.optimizer.weight_decay == 0.05  # another arm does not move

    provenance = cfg.tuned.adamw.provenance
    assert (provenance.trials, list(provenance.seeds), provenance.eval_split) == (TRIALS, [100], "validation")
    assert provenance.commit == "c0ffee" and set(provenance.space) == {
        "train.base_lr",
        "optimizer.weight_decay",
        "train.warmup_epochs",
    }
    trials = pd.read_csv(results / "vit" / "digits" / "tuning.csv")
    assert list(trials["trial"]) == list(range(TRIALS)) and set(trials["seed"]) == {100}
    assert (trials["eval_split"] == "validation").all() and list(trials["score"]) == list(provenance.scores)
    pick = trials[trials["pick"]]
    assert len(pick) == 1 and pick["score"].item() == max(trials["score"]) == provenance.pick.score
    assert pick["train.base_lr"].item() == pytest.approx(values["base_lr"], rel=1e-12)


def _provenance(trials: int, seeds: list[int], split: str = "validation", **record) -> dict:
    space = {"train.lr": "tag(log, interval(3e-4, 2e-2))"}  # one shared space (tests/test_search_spaces.py)
    return {"provenance": {"trials": trials, "seeds": seeds, "eval_split": split, "space": space, "edges": [],
                           **record}}  # fmt: skip


DECAY = {"train.lr": "tag(log, interval(3e-4, 2e-2))", "optimizer.weight_decay": "tag(log, interval(1e-3, 1.0))"}


@pytest.mark.parametrize(
    "arms,message",
    [
        (
            {"adamw": _provenance(16, [100]), "horst": _provenance(8, [100])},
            r"unequal tuning budgets \(trials: adamw 16, horst 8\)",
        ),
        (
            {"adamw": _provenance(16, [100]), "horst": _provenance(16, [3])},
            r"arm horst was tuned on reporting seeds \[3\]",
        ),
        ({"adamw": _provenance(16, [100]), "horst": _provenance(16, [101])}, "arms tuned on different seeds"),
        (
            {"adamw": _provenance(16, [100]), "horst": _provenance(16, [100], "test")},
            "arm horst was tuned on eval_split=test",
        ),
        (
            {"adamw": _provenance(16, [100]), "horst": {"provenance": None}},
            "arm horst was not tuned by horst-sparse tune",
        ),
        (  # AdamW's lr alone (--keys), HORST's lr and decay: the shared keys nest, but HORST searched more of them
            {"adamw": _provenance(16, [100], left_out=["optimizer.weight_decay"]),
             "horst": _provenance(16, [100], space=DECAY)},
            r"^arm adamw was tuned without searching optimizer.weight_decay \(--keys\), which horst searched",
        ),
        (
            {"adamw": _provenance(16, [100], refine={"trials": 8}), "horst": _provenance(16, [100])},
            r"unequal second stages \(adamw 8, horst 0\)",
        ),
        (
            {"adamw": _provenance(16, [100], stability={"radius": 0.3}), "horst": _provenance(16, [100])},
            r"unequal stability guards \(radius adamw 0.3, horst None\)",
        ),
        (
            {"adamw": _provenance(16, [100], engine="fast"), "horst": _provenance(16, [100])},
            r"arms tuned on different engines \(adamw fast, horst reference\)",
        ),
        (  # a pick at an edge its protocol did not declare, with no second stage to refine it
            {"adamw": _provenance(16, [100], edges=["train.lr at the upper edge"])},
            r"arm adamw's pick has train.lr at the upper edge of its range",
        ),
    ],
)  # fmt: skip
def test_unequal_budgets_are_refused(arms, message):
    with pytest.raises(budget.BudgetError, match=message):
        budget.check_equal_budgets(arms, arms, reporting_seeds=range(10))


def test_an_edge_left_after_a_second_stage_is_flagged_not_refused():
    """The second stage refined the edge past the range the protocol fixed: what is left there is in
    the pick's provenance (`edges`), and the study runs."""
    refined = _provenance(16, [100], edges=["train.lr at the upper edge"], refine={"trials": 8})
    budget.check_equal_budgets({"adamw": refined}, ["adamw"], reporting_seeds=range(10))


def test_equal_budgets_pass_and_the_committed_picks_were_not_tuned_alike(tuned):
    """The check reads a run's composed `tuned` node: the fresh AdamW pick passes; next to the
    committed HORST grid pick (made before this protocol) it is refused."""
    _, configs, _ = tuned
    cfg = _compose(configs)
    budget.check_equal_budgets(cfg.tuned, ["adamw"], reporting_seeds=range(10))
    equal = {"adamw": _provenance(16, [100, 101]), "horst": _provenance(16, [100, 101])}
    budget.check_equal_budgets(equal, equal, reporting_seeds=range(10))
    with pytest.raises(budget.BudgetError, match="arm horst was not tuned"):
        budget.check_equal_budgets(cfg.tuned, ["adamw", "horst"], reporting_seeds=range(10))


def test_trial_i_of_every_arm_is_the_same_point_in_the_shared_space(tuned):
    """HORST tuned beside AdamW (the fixture's) through the real sweeper: trial i of both has the
    same lr, decay and warm-up (one Sobol sequence, the shared coordinates first), so the two
    tunings are a paired comparison that differs only in HORST's alpha and beta."""
    _, configs, results = tuned
    tuning.tune("vit", "horst", trials=TRIALS, overrides=TINY, commit="c0ffee", command="pytest", config_dir=configs,
                results_dir=results, sweep_dir=configs.parent / "sweep_horst")  # fmt: skip
    (record,) = results.glob("vit/*/tuning.csv")  # the default recipe's
    trials = pd.read_csv(record)
    shared = ["train.base_lr", "optimizer.weight_decay", "train.warmup_epochs"]
    adamw, horst = (
        trials[trials.arm == arm].sort_values("trial")[shared].reset_index(drop=True) for arm in ("adamw", "horst")
    )
    assert len(adamw) == len(horst) == TRIALS
    pd.testing.assert_frame_equal(adamw, horst)
    assert trials[trials.arm == "horst"]["optimizer.alpha"].nunique() == TRIALS


def _sobol_points(scores) -> list[dict]:
    optuna = sobol.optuna  # imported there without its SQLAlchemy deprecation warning
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=sobol.SobolSampler(seed=0))
    for score in scores:
        trial = study.ask()
        (
            trial.suggest_float("lr", 1e-4, 1e-2, log=True),
            trial.suggest_int("warmup", 0, 7),
            trial.suggest_float("beta", 0, 1),
        )
        study.tell(trial, score)
    return [t.params for t in study.trials]


def test_the_sobol_sampler_stratifies_every_coordinate_whatever_the_scores():
    """The first 2^m points of a scrambled Sobol sequence put one point in each of the 2^m equal
    slices of every coordinate (log-uniform: of the log), and the points do not depend on the
    scores, so every arm is searched alike and parallel batches equal sequential trials."""
    points = _sobol_points([0.0] * 8)
    assert sorted(int(8 * math.log10(p["lr"] / 1e-4) / 2) for p in points) == list(range(8))
    assert sorted(p["warmup"] for p in points) == list(range(8))
    assert sorted(int(8 * p["beta"]) for p in points) == list(range(8))
    assert _sobol_points([float(n % 3) for n in range(8)]) == points


def _gpt2_summary(*ppls, split="validation") -> dict:
    rows = [
        {"method": "magnitude", "pattern": "unstructured", "sparsity": s, "ppl": p}
        for s, p in zip((0.0, 0.5, 0.9), ppls)
    ]
    return {
        "eval_split": split,
        "pruning": {"results": [*rows, {"method": "wanda", "pattern": "unstructured", "sparsity": 0.5, "ppl": 1.0}]},
    }


def test_the_score_is_the_validation_metric_and_a_failure_scores_worst():
    """GPT-2: the geometric mean of the magnitude rows at 50-90 % (not the dense row, not
    Wanda's); a non-finite perplexity (null in summary.json) or a failed run scores worst; a
    summary of the test split is refused."""
    assert tuning.validation_score(get("gpt2"), _gpt2_summary(10.0, 20.0, 80.0)) == pytest.approx(40.0)
    assert tuning.validation_score(get("gpt2"), _gpt2_summary(10.0, None, 80.0)) == math.inf
    assert tuning.validation_score(get("vit"), {"status": "failed", "reason": "non-finite loss"}) == -math.inf
    assert tuning.validation_score(get("vit"), {"eval_split": "validation", "top1": 0.75}) == 0.75
    with pytest.raises(tuning.TuningError, match="scored on eval_split=test"):
        tuning.validation_score(get("gpt2"), _gpt2_summary(10.0, 20.0, 80.0, split="test"))


# An arm's space, configs/hparams_search/<pipeline>_<optimizer>.yaml, over its pipeline's shared one
SEARCH_SPACES = sorted(p.stem for p in (ROOT / "configs" / "hparams_search").glob("*_*.yaml"))


@pytest.mark.parametrize("name", SEARCH_SPACES)
def test_every_search_space_reaches_its_arm(name):
    """Each optimizer's space (the shared lr, decay and warm-up; HAM, HORST add alpha, beta)
    composes, and every key it searches is read from the arm's tuned file."""
    pipeline, optimizer = name.split("_", 1)
    planned = tuning.prepare(pipeline, optimizer, trials=4)
    leaves = {key.rsplit(".", 1)[1] for key in planned.space}
    shared = {
        get(pipeline).configs.lr_key.rsplit(".", 1)[1],
        "weight_decay",
        f"warmup_{'epochs' if pipeline == 'vit' else 'steps'}",
    }
    assert leaves == (shared if optimizer == "adamw" else shared | {"alpha", "beta"})
    assert planned.tuned_file == ROOT / "configs" / "tuned" / pipeline / f"{planned.recipe}.yaml"
    assert "hydra.sweeper.n_trials=4" in planned.arguments and planned.seed >= tuning.TUNING_SEEDS_START


@pytest.mark.parametrize(
    "overrides,keys,message",
    [
        (["seed=7"], None, "seed=7: tuning seeds start at 100"),
        (["eval_split=test"], None, "eval_split=test: tuning scores on the validation split only"),
        (
            ["train.min_lr=tag(log, interval(1e-6, 1e-4))"],
            None,
            "searches train.min_lr, which the run does not read from tuned.adamw.min_lr",
        ),
        (  # the smoke preset sets the warm-up itself
            ["experiment=smoke_vit"],
            None,
            r"^vit_adamw.yaml searches train.warmup_epochs, which the run does not read from tuned.adamw.warmup_epochs "
            r"\(it is 1\): the pick would never reach a run; leave it out with --keys "
            r"train.base_lr,optimizer.weight_decay$",
        ),
        (
            [],
            ["train.lr"],
            r"^--keys train.lr is not a key of the search space; vit_adamw.yaml searches train.base_lr, "
            r"optimizer.weight_decay, train.warmup_epochs$",
        ),
        (
            ["train.warmup_epochs=int(interval(0, 2))"],
            ["train.base_lr"],
            r"^train.warmup_epochs=int\(interval\(0, 2\)\) sweeps a key --keys leaves out: add train.warmup_epochs",
        ),
    ],
)
def test_a_tuning_that_could_not_count_is_refused_before_any_trial(overrides, keys, message):
    with pytest.raises(tuning.TuningError, match=message):
        tuning.prepare("vit", "adamw", overrides=overrides, keys=keys, elsewhere=True)


def test_a_dirty_tree_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.txt").write_text("a\n")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    assert len(tuning.require_clean_tree(tmp_path)) == 40
    (tmp_path / "a.txt").write_text("b\n")
    monkeypatch.setattr(tuning, "ROOT", tmp_path)
    with pytest.raises(
        SystemExit, match=r"^error: the git tree at .* has uncommitted changes \(M a.txt, \.\.\.\): commit or stash"
    ):
        tuning.main(["vit", "adamw"])


def test_a_tuning_may_start_beside_the_other_arms_uncommitted_picks(tmp_path):
    """A study tunes its arms one after another: the other arms' sections of the pipeline's tuned
    files and results/ may be uncommitted; the arm's own section, another pipeline's file and
    everything else may not."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    sections = {"adamw": {"lr": 1}, "ham": {"lr": 1}, "horst": {"lr": 1}}
    files = {
        "configs/tuned/vit/mnist1d.yaml": yaml.safe_dump(sections),
        "configs/tuned/gpt2/pydoc.yaml": yaml.safe_dump(sections),
        "results/tuning/vit/mnist1d/tuning.csv": "a\n",
        "results/embedded/runs.csv": "a\n",
        "horst/step.py": "a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    picked = yaml.safe_dump({**sections, "adamw": {"lr": 2}, "horst": {"lr": 2}})  # AdamW and HORST tuned
    for name in ("configs/tuned/vit/mnist1d.yaml", "configs/tuned/gpt2/pydoc.yaml"):
        (tmp_path / name).write_text(picked)
    for name in ("results/tuning/vit/mnist1d/tuning.csv", "results/embedded/runs.csv"):
        (tmp_path / name).write_text("b\n")
    with pytest.raises(tuning.TuningError, match=r"uncommitted changes \(M configs/tuned/gpt2/pydoc.yaml"):
        tuning.require_clean_tree(tmp_path, tuning=("vit", "ham"))  # gpt2's picks are not the ViT's
    subprocess.run([*git, "checkout", "-q", "configs/tuned/gpt2"], check=True)
    assert tuning.require_clean_tree(tmp_path, tuning=("vit", "ham")) == head
    with pytest.raises(tuning.TuningError, match=r"uncommitted changes \(M configs/tuned/vit/mnist1d.yaml"):
        tuning.require_clean_tree(tmp_path, tuning=("vit", "horst"))  # its own section
    with pytest.raises(tuning.TuningError, match=r"uncommitted changes \(M configs/tuned/vit/mnist1d.yaml"):
        tuning.require_clean_tree(tmp_path, tuning=("vit", "sgd"))  # no section of its own to be unchanged
    (tmp_path / "horst" / "step.py").write_text("b\n")
    with pytest.raises(tuning.TuningError, match="horst/step.py"):
        tuning.require_clean_tree(tmp_path, tuning=("vit", "ham"))


def test_a_failed_trial_scores_worst_and_the_others_still_pick(tmp_path, capsys):
    """A trial that fails (here AdamW refuses a negative decay; in a study, a diverged lr) is a
    result of the tuning, not its end: the runner lists it and exits non-zero, the tuning scores it
    worst and picks among the rest. With --keys the other keys of the space are not searched: the
    warm-up stays the recipe's."""
    configs = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", configs)
    before = yaml.safe_load((configs / "tuned" / "vit" / "digits.yaml").read_text())["adamw"]
    overrides = (  # Sobol's 2 points take both halves of the decay's choice
        *(o for o in TINY if not o.startswith("train.warmup_epochs=")),
        "optimizer.weight_decay=choice(0.01, -1.0)",
    )
    values = tuning.tune(
        "vit",
        "adamw",
        trials=2,
        keys=["train.base_lr", "optimizer.weight_decay"],
        overrides=overrides,
        commit="c0ffee",
        command="pytest",
        config_dir=configs,
        results_dir=tmp_path / "results",
        sweep_dir=tmp_path / "sweep",
    )
    assert (
        "1 cell(s) of this multirun failed (listed above); the others ran: they score worst" in capsys.readouterr().err
    )
    rows = pd.read_csv(tmp_path / "results" / "vit" / "digits" / "tuning.csv")
    failed, finished = rows[rows.status == "failed"], rows[rows.status == "finished"]
    assert list(failed["optimizer.weight_decay"]) == [-1.0] and failed.score.item() == -math.inf
    assert values["weight_decay"] == 0.01 and values["provenance"]["pick"]["score"] == finished.score.item() > 0
    assert "train.warmup_epochs" not in rows and values["warmup_epochs"] == before["warmup_epochs"]
    assert list(values["provenance"]["space"]) == ["train.base_lr", "optimizer.weight_decay"]
    trained = [yaml.safe_load(f.read_text()) for f in (tmp_path / "sweep").glob("*_vit_*/config.yaml")]
    assert trained and {c["train"]["warmup_epochs"] for c in trained} == {before["warmup_epochs"]}  # as run
    written = yaml.safe_load((configs / "tuned" / "vit" / "digits.yaml").read_text())
    assert (
        written["adamw"] == values
        and written["horst"]
        == yaml.safe_load((ROOT / "configs" / "tuned" / "vit" / "digits.yaml").read_text())["horst"]
    )  # the pick in its section, the other sections as they were


def test_a_tuning_that_cannot_start_still_ends_in_one_line(tmp_path):
    """Only the runner's failed-cells exit is a result; any other exit (here an unwritable sweep
    folder) still ends the tuning."""
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match=r"hydra.sweep.dir=.* cannot be written"):
        tuning.tune(
            "vit",
            "adamw",
            trials=1,
            overrides=TINY,
            commit="c0ffee",
            command="pytest",
            out=tmp_path / "picked",  # TINY changes the recipe: the pick may not go to its tuned file
            sweep_dir=tmp_path / "file" / "sweep",
        )


@pytest.mark.slow  # two trials as submitit subprocesses (~1-3 min here)
def test_trials_run_through_submitit_as_on_slurm(tmp_path):
    """`hydra/launcher=local` is submitit's executor, the code path of `hydra/launcher=slurm`:
    each trial is pickled (the task function by reference), run in its own process, and its
    score comes back to the sweeper."""
    configs = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", configs)
    overrides = (
        *TINY,
        "model=vit_nano",
        "train.batch_size=256",
        "train.base_batch_size=256",
        "hydra/launcher=local",
        "hydra.sweeper.n_jobs=2",
    )
    values = tuning.tune(
        "vit",
        "adamw",
        trials=2,
        overrides=overrides,
        commit="c0ffee",
        command="pytest",
        config_dir=configs,
        results_dir=tmp_path / "results",
        sweep_dir=tmp_path / "sweep",
    )
    assert len(list((tmp_path / "sweep" / ".submitit").rglob("*_log.out"))) == 2
    assert len(values["provenance"]["scores"]) == 2 and all(0 < s <= 1 for s in values["provenance"]["scores"])


def test_a_trial_scores_the_mean_over_its_cells_and_the_best_are_rerun_at_more_seeds(tmp_path):
    """A trial of the ViT runs once per sparsity the claims report (`tune_over`) and scores their
    mean; the top k trials are rerun at the next tuning seeds through Hydra's multirun, and the pick
    is the best mean over seeds among them (every row in tuning.csv, stage search or rerun)."""
    configs = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", configs)
    overrides = (*TINY[:-1], "tune_over={acdc:{sparsity:[0.5,0.9]}}")
    values = tuning.tune("vit", "horst", trials=2, top_k=1, rerun_seeds=1, overrides=overrides, commit="c0ffee",
                         command="pytest", config_dir=configs, results_dir=tmp_path / "results",
                         sweep_dir=tmp_path / "sweep")  # fmt: skip
    rows = pd.read_csv(tmp_path / "results" / "vit" / "digits" / "tuning.csv")
    assert list(zip(rows.stage, rows.seed)) == [("search", 100), ("search", 100), ("rerun", 101)]
    search = rows[rows.stage == "search"]
    best = search.loc[search.score.idxmax()]
    assert rows[rows.stage == "rerun"].trial.item() == best.trial  # the top 1, its values as sampled
    for key in ("train.base_lr", "optimizer.alpha"):
        assert rows[rows.stage == "rerun"][key].item() == best[key]
    for row in rows.itertuples():  # each score: the mean of its two runs' validation top-1
        folder = tmp_path / "sweep" if row.stage == "search" else tmp_path / "sweep" / "rerun" / f"trial{row.trial}"
        (trial,) = [p for p in folder.iterdir() if p.name.startswith(f"{0 if row.stage == 'rerun' else row.trial}_")]
        assert f"_s0.5,0.9_seed{row.seed}_" in trial.name  # named by what it holds: a run at each sparsity
        top1 = [json.loads((trial / f"acdc.sparsity={s}" / "summary.json").read_text()) for s in (0.5, 0.9)]
        assert {t["eval_split"] for t in top1} == {"validation"}
        assert row.score == pytest.approx(sum(t["top1"] for t in top1) / 2)
        assert [t["target_sparsity"] for t in top1] == [0.5, 0.9]
    pick = values["provenance"]["pick"]
    assert pick["trial"] == best.trial and pick["score"] == pytest.approx(rows[rows.trial == best.trial].score.mean())
    assert values["provenance"]["top_k"] == 1 and values["provenance"]["rerun_seeds"] == [101]
    assert "the mean over acdc.sparsity=0.5; acdc.sparsity=0.9" in values["provenance"]["metric"]


@pytest.mark.slow  # a real multi-process run; make test-all (keeps make test under 10 min on 2 cores)
def test_overrides_that_change_the_recipe_never_write_its_picks(tmp_path):
    """`horst-sparse tune vit horst experiment=smoke_vit` once rewrote the 40-epoch recipe's committed pick
    with a 4-epoch one: overrides that change what the recipe trains are refused, naming them,
    unless the pick goes elsewhere (--out) or nowhere (--dry-run); where and how fast it runs is fine."""
    with pytest.raises(
        tuning.TuningError, match=r"experiment=smoke_vit, train.epochs=4 change the recipe's training.*--out"
    ):
        tuning.prepare("vit", "horst", trials=2, overrides=["experiment=smoke_vit", "train.epochs=4", "cpu_threads=1"])
    planned = tuning.prepare(
        "vit", "horst", trials=2, overrides=["vit_recipe=mnist1d", "cpu_threads=1", "logging.mode=disabled",
                                             "hydra/launcher=joblib", "seed=101", "data.root=/tmp/elsewhere"]
    )  # fmt: skip
    assert planned.recipe == "mnist1d"

    def status() -> str:
        return subprocess.run(
            ["git", "status", "--porcelain", "configs", "results"], cwd=ROOT, capture_output=True, text=True
        ).stdout

    before = status()
    out = tmp_path / "picked"
    values = tuning.tune("vit", "adamw", trials=1, overrides=TINY, commit="c0ffee", command="pytest", out=out,
                         sweep_dir=tmp_path / "sweep")  # fmt: skip
    assert yaml.safe_load((out / "pick" / "adamw.yaml").read_text())["base_lr"] == values["base_lr"]
    assert len(pd.read_csv(out / "tuning.csv")) == 1
    dry = tuning.tune("vit", "adamw", trials=1, overrides=TINY, commit="c0ffee", command="pytest", dry_run=True,
                      sweep_dir=tmp_path / "sweep")  # the same trial, finished: nothing reruns  # fmt: skip
    assert dry["base_lr"] == values["base_lr"]
    assert status() == before  # the repository's picks and records untouched


def test_untracked_files_under_configs_make_the_tree_dirty(tmp_path):
    git = ["git", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a.yaml").write_text("a: 1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "a"], check=True)
    (tmp_path / "configs" / "mine.yaml").write_text("b: 2\n")
    with pytest.raises(tuning.TuningError, match=r"uncommitted changes \(\?\? configs/mine.yaml"):
        tuning.require_clean_tree(tmp_path, tuning=("vit", "horst"))


def _help_examples(clone: Path, env: dict) -> list[str]:
    """The example lines of `horst-sparse tune --help`: the block under its line "examples, ...:"."""
    shown = subprocess.run(
        [HORST_SPARSE, "tune", "--help"], cwd=clone, env=env, capture_output=True,
        text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    lines = shown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("examples"))
    block = "\n".join(lines[start + 1 :]).strip("\n").split("\n\n")[0]
    return [line.strip() for line in block.splitlines()]


@pytest.mark.slow  # 3 + 2 tuning trials and 2 runs at smoke size through the commands (~2-4 min on 2 cores)
def test_the_help_examples_run_as_written(tmp_path):
    """Every example of `horst-sparse tune --help` runs as written, in a clean clone (the tuner refuses a
    dirty tree): the smoke tuning of the learning rate alone writes its pick to --out, with the
    command as typed; a run loads it as the help says and trains at the pick (at the picked trial's
    seed and split it is that trial's run again, to the bit); the GPT-2 example reruns its better
    trial and writes nothing. Trial folders name every sparsity their runs hold."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {**_subprocess_env(), "PYTHONPATH": str(clone), "OMP_WAIT_POLICY": "PASSIVE"}
    commands = {"horst-sparse": HORST_SPARSE, "python": sys.executable}

    def run(line: str) -> str:
        argv = shlex.split(line)
        done = subprocess.run([commands[argv[0]], *argv[1:]], cwd=clone, env=env, capture_output=True, text=True,
                              timeout=900)  # fmt: skip
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        return done.stdout

    def status() -> str:
        return subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout

    examples = _help_examples(clone, env)
    assert [shlex.split(e)[:4] for e in examples] == [
        ["horst-sparse", "tune", "vit", "adamw"],
        ["python", "train_vit.py", "--config-dir", "outputs/picks/vit"],
        ["horst-sparse", "tune", "gpt2", "horst"],
    ]
    tune_vit, run_vit, tune_gpt2 = examples
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()

    printed = run(tune_vit)
    out = clone / shlex.split(tune_vit)[shlex.split(tune_vit).index("--out") + 1]
    pick = yaml.safe_load((out / "pick" / "adamw.yaml").read_text())
    provenance = pick["provenance"]
    assert provenance["made_by"] == tune_vit and provenance["commit"] == head
    assert list(provenance["space"]) == ["train.base_lr"] and provenance["trials"] == 3
    assert f"written to {provenance['tuning_csv']}" in printed and len(pd.read_csv(out / "tuning.csv")) == 3
    (sweep,) = (clone / "multirun" / "tuning" / "vit_digits_adamw").iterdir()
    trials = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(trials) == 3
    for folder in trials:
        assert "_s0.7,0.8,0.9_seed100_" in folder.name
        assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
            "acdc.sparsity=0.7", "acdc.sparsity=0.8", "acdc.sparsity=0.9"
        ]  # fmt: skip
    assert status() == ""  # outputs/ and multirun/ only: the repository's picks and records untouched

    printed = run(run_vit)
    folder = clone / printed.rsplit("run folder: ", 1)[1].split()[0]
    trained = yaml.safe_load((folder / "config.yaml").read_text())
    assert trained["train"]["base_lr"] == pick["base_lr"] != 3e-3  # the pick, not the recipe's
    assert trained["train"]["warmup_epochs"] == 1 and trained["tuned"]["adamw"]["provenance"]["made_by"] == tune_vit

    picked = next(p for p in trials if p.name.startswith(f"{provenance['pick']['trial']}_"))
    again = clone / "outputs" / "again"
    run(f"{run_vit} seed=100 acdc.sparsity=0.9 hydra.run.dir={again}")
    top1 = [json.loads((d / "summary.json").read_text())["top1"] for d in (again, picked / "acdc.sparsity=0.9")]
    assert top1[0] == top1[1]

    printed = run(tune_gpt2)
    assert "nothing written (--dry-run)" in printed and "alpha:" in printed and status() == ""
    (sweep,) = (clone / "multirun" / "tuning" / "gpt2_pydoc_horst").iterdir()
    (rerun,) = (sweep / "rerun").iterdir()
    assert [p.name.split("_seed")[1][:3] for p in rerun.iterdir() if p.is_dir()] == ["101"]


@pytest.mark.slow  # 2 + 2 trials and a rerun of the tiny ViT (~20 s here; make test keeps under 10 min)
def test_a_second_stage_samples_fresh_points_around_the_best_and_the_guard_keeps_the_pick_stable(tmp_path):
    """`--refine-trials 2 --stability-radius 0.3`: after the search, two fresh quasi-random points
    (another scramble) in the box around its best, numbered after the search's; the best trial
    of both stages is rerun and picked, and the provenance holds the box and the guard."""
    configs = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", configs)
    values = tuning.tune("vit", "horst", trials=2, top_k=1, rerun_seeds=1, refine_trials=2, radius=0.3,
                         overrides=TINY, commit="c0ffee", command="pytest", config_dir=configs,
                         results_dir=tmp_path / "results", sweep_dir=tmp_path / "sweep")  # fmt: skip
    rows = pd.read_csv(tmp_path / "results" / "vit" / "digits" / "tuning.csv")
    assert list(zip(rows.stage, rows.trial)) == [("search", 0), ("search", 1), ("refine", 2), ("refine", 3),
                                                 ("rerun", rows.trial.iloc[4])]  # fmt: skip
    sampled = rows[rows.stage != "rerun"]
    best = rows[rows.stage == "search"].loc[rows[rows.stage == "search"].score.idxmax()]
    record = values["provenance"]
    box = record["refine"]["space"]
    assert box == tuning.refine_space(record["space"], best.to_dict(), 0.3) and record["refine"]["trials"] == 2
    for key in ("train.base_lr", "optimizer.alpha", "optimizer.beta"):  # inside the box
        assert all(0 <= tuning.position(value, box[key]) <= 1 for value in rows[rows.stage == "refine"][key])
    assert not sampled[["train.base_lr", "optimizer.alpha"]].duplicated().any()  # fresh points, not the search's
    assert rows.trial.iloc[4] == sampled.loc[sampled.score.idxmax()].trial  # the best of both stages, rerun
    assert record["stability"] == {"radius": 0.3, "unstable": {}, "flag": None}
    assert record["pick"]["trial"] == rows.trial.iloc[4]
