"""Where every optimizer and schedule value of a run comes from (docs/design.md, "Configuration").

A distinct sentinel is written into every value of a copy of `configs/optimizer/` and of every
arm's section of the tuned files (`configs/tuned/<pipeline>/<recipe>.yaml`); every (pipeline, recipe,
optimizer) and every experiment is composed from the copy. Each composed value must be the
sentinel of the file `owner` names (the table of docs/design.md), and every sentinel must reach
some run: a value that can never win is dead and has no place in a YAML.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from horst_sparse.compose import compose
from horst_sparse.pipeline import get, names

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

PIPELINES = {name: get(name) for name in names()}
WARMUP_KEYS = {"vit": "warmup_epochs", "gpt2": "warmup_steps"}  # train.* keys the tuned files feed besides the lr
TUNED_OPTIMIZERS = ("adamw", "ham", "horst")  # the optimizers each recipe's tuned file has a section for
RECIPE_DEPENDENT = ("weight_decay", "betas", "alpha", "beta")  # their optimizer.* keys that differ by recipe
IDENTITY = ("_target_", "_partial_", "name")  # what an optimizer is, not a value
OPTIMIZERS = sorted(p.stem for p in (CONFIGS / "optimizer").glob("*.yaml"))


def tuned_train_keys(pipeline: str) -> tuple[str, str]:
    """The train.* keys each optimizer's tuned file feeds: the learning rate and the warm-up."""
    return PIPELINES[pipeline].configs.lr_key.removeprefix("train."), WARMUP_KEYS[pipeline]


def recipes(pipeline: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / PIPELINES[pipeline].recipe_group).glob("*.yaml"))


def experiments() -> dict[str, tuple[str, str]]:
    """experiment: (pipeline, the recipe it selects), of the experiments that select one (an arm does not)."""
    found = {}
    for path in sorted((CONFIGS / "experiment").glob("*.yaml")):
        defaults = yaml.safe_load(path.read_text()).get("defaults", [])
        for pipeline, registered in PIPELINES.items():
            group = registered.recipe_group
            for entry in defaults:
                if isinstance(entry, dict) and f"override /{group}" in entry:
                    found[path.stem] = (pipeline, entry[f"override /{group}"])
    return found


def owner(pipeline: str, recipe: str, optimizer: str, key: str) -> tuple[str, str | None]:
    """(the file under configs/, its section) whose value `key` takes in a run: docs/design.md's table."""
    section, leaf = key.split(".", 1)
    if section == "train":  # lr and warm-up: the optimizer's tuned section; untuned optimizers run at AdamW's
        return f"tuned/{pipeline}/{recipe}.yaml", optimizer if optimizer in TUNED_OPTIMIZERS else "adamw"
    if optimizer in TUNED_OPTIMIZERS and leaf in RECIPE_DEPENDENT:
        return f"tuned/{pipeline}/{recipe}.yaml", optimizer
    return f"optimizer/{optimizer}.yaml", None


def _sentinel(value, number: int):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return 1000 + number
    if isinstance(value, float):
        return 1000.5 + number
    if isinstance(value, list):
        return [1000.25 + number, 1000.75 + number]
    return f"sentinel{number}"


@pytest.fixture(scope="module")
def sentinels(tmp_path_factory) -> tuple[Path, dict[tuple[str, str], object]]:
    """A copy of configs/ with a distinct sentinel in every value of the optimizer and tuned
    files' sections, and {((file, section), key): sentinel} (section None: the whole file)."""
    root = tmp_path_factory.mktemp("configs") / "configs"
    shutil.copytree(CONFIGS, root)
    planted, numbers = {}, itertools.count()
    for path in sorted(root.glob("optimizer/*.yaml")) + sorted(root.glob("tuned/*/*.yaml")):
        whole = yaml.safe_load(path.read_text())
        tuned = path.parent.parent.name == "tuned"
        sections = [(arm, node) for arm, node in whole.items() if isinstance(node, dict)] if tuned else [(None, whole)]
        for section, node in sections:
            for key, value in node.items():
                if key in IDENTITY or key == "provenance" or (isinstance(value, str) and "${" in value):
                    continue  # identity, the record of a tuning, or a wire to the tuned node
                place = ((str(path.relative_to(root)), section), key)
                node[key] = planted[place] = _sentinel(value, next(numbers))
        path.write_text(yaml.safe_dump(whole))
    return root, planted


def experiment_values(experiment: str) -> dict[str, object]:
    """The dotted keys an experiment file sets itself: they win over the tuned files (the
    experiment comes after the recipe in the defaults list)."""
    node = yaml.safe_load((CONFIGS / "experiment" / f"{experiment}.yaml").read_text())
    return {
        f"{section}.{key}": value
        for section in ("optimizer", "train")
        for key, value in (node.get(section) or {}).items()
    }


def cases():
    """Every (pipeline, recipe, optimizer); every experiment, the optimizers taking turns (a
    composition costs ~0.2-0.5 s here). The last item: the values the experiment sets itself."""
    for pipeline, optimizer in itertools.product(PIPELINES, OPTIMIZERS):
        for recipe in recipes(pipeline):
            yield pipeline, recipe, optimizer, [f"{PIPELINES[pipeline].recipe_group}={recipe}"], {}
    for (experiment, (pipeline, recipe)), optimizer in zip(experiments().items(), itertools.cycle(OPTIMIZERS)):
        yield pipeline, recipe, optimizer, [f"experiment={experiment}"], experiment_values(experiment)


def _compose(config_dir: Path, pipeline: str, overrides: list[str]):
    return compose(PIPELINES[pipeline], overrides, config_dir=config_dir)


# On the command line the resolver's commas need quotes around the value (Hydra's grammar).
CONTROL_DECAY = "optimizer.weight_decay='${sum:${tuned.horst.weight_decay},${tuned.horst.beta}}'"


def test_every_value_comes_from_its_owner_and_none_is_dead(sentinels):
    root, planted = sentinels
    reached = set()
    for pipeline, recipe, optimizer, overrides, own in cases():
        cfg = _compose(root, pipeline, [f"optimizer={optimizer}", *overrides])
        values = {f"optimizer.{k}": v for k, v in OmegaConf.to_container(cfg.optimizer, resolve=True).items()}
        values.update({f"train.{k}": cfg.train[k] for k in tuned_train_keys(pipeline)})
        for key, value in values.items():
            if key.split(".")[1] in IDENTITY:
                continue
            if key in own:
                assert value == own[key], f"{pipeline} {overrides}: {key} is not the experiment's"
                continue
            source = (owner(pipeline, recipe, optimizer, key), key.split(".")[1])
            assert source in planted, f"{pipeline} {overrides} optimizer={optimizer}: {key} has no owner in the table"
            assert value == planted[source], f"{pipeline} {overrides} optimizer={optimizer}: {key} is not {source[0]}'s"
            reached.add(source)
    # an arm tuned on its own (horst_prunable) reads its own section's values: `experiment=<arm>` composes them
    for ((file, name), leaf), value in planted.items():
        if name and name not in OPTIMIZERS and ((file, name), leaf) not in reached:
            _, pipeline, recipe = file.removesuffix(".yaml").split("/")
            cfg = _compose(root, pipeline, [f"{PIPELINES[pipeline].recipe_group}={recipe}", f"experiment={name}"])
            section = "train" if leaf in tuned_train_keys(pipeline) else "optimizer"
            assert cfg[section][leaf] == value, f"{pipeline} {recipe} {name}: {section}.{leaf} is not {file}'s"
            reached.add(((file, name), leaf))
    dead = sorted(set(planted) - reached)
    assert not dead, f"values no run composes (remove them): {dead}"


def test_the_tables_cases_cover_every_recipe_and_experiment():
    # an experiment selects a recipe (a paper cell, a smoke test) or is an arm of the studies (it names its `arm`)
    arms = {p.stem for p in (CONFIGS / "experiment").glob("*.yaml") if yaml.safe_load(p.read_text()).get("arm")}
    assert set(experiments()) | arms == {p.stem for p in (CONFIGS / "experiment").glob("*.yaml")}
    for pipeline in PIPELINES:
        # every arm with a search space (an optimizer, or an arm tuned on its own) has a section in every recipe's file
        searched = sorted(
            p.stem.removeprefix(f"{pipeline}_") for p in (CONFIGS / "hparams_search").glob(f"{pipeline}_*.yaml")
        )
        assert set(TUNED_OPTIMIZERS) <= set(searched)
        for recipe in recipes(pipeline):
            tuned = yaml.safe_load((CONFIGS / "tuned" / pipeline / f"{recipe}.yaml").read_text())
            assert sorted(arm for arm, node in tuned.items() if isinstance(node, dict)) == searched


def _chosen(path: Path) -> list[Path]:
    """The files a config's defaults list adds below it (not `_self_`, not an override of a choice made above)."""
    found = []
    for entry in (yaml.safe_load(path.read_text()) or {}).get("defaults", []):
        if isinstance(entry, str) and entry != "_self_":
            found.append(path.parent / f"{entry}.yaml")
        elif isinstance(entry, dict):
            for group, option in entry.items():
                if not group.startswith(("override ", "hydra", "/hydra")) and option is not None:
                    base = CONFIGS if group.startswith("/") else path.parent
                    found.append(base / group.lstrip("/").split("@")[0] / f"{option}.yaml")
    return [p for p in found if p.is_file()]


def test_every_run_composes_at_most_two_levels_of_defaults():
    """The primary config's defaults list, and at most one level below it: a file one of its groups
    (or a `+group=` of the command line) chooses may add files, which add none."""
    for path in sorted(CONFIGS.glob("*/*.yaml")):
        for below in _chosen(path):
            assert not _chosen(below), (
                f"{path.relative_to(CONFIGS)} -> {below.relative_to(CONFIGS)} -> {_chosen(below)}"
            )


def test_no_defaults_list_builds_a_name_from_other_choices():
    """A config file chosen by an interpolation (`${recipe}_${optimizer}`) is invisible in the
    tree and, if optional, silently skipped: every defaults entry names its file."""
    for path in CONFIGS.rglob("*.yaml"):
        for entry in (yaml.safe_load(path.read_text()) or {}).get("defaults", []):
            assert "${" not in str(entry), f"{path.relative_to(CONFIGS)}: {entry}"
            assert not str(entry).startswith("{'optional"), f"{path.relative_to(CONFIGS)}: {entry}"


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_control_interpolates_the_arm_it_controls(sentinels, pipeline):
    """The decay-matched AdamW (configs/experiment/adamw_decay.yaml) follows HORST's and AdamW's tuned
    sections, whatever their values: AdamW's own lr, and the decay that shrinks as hard per step as
    HORST, (wd_h + beta_h) lr_h / lr_a, derived, never copied. The `sum` resolver, for controls
    written on the command line, adds."""
    root, planted = sentinels
    lr = tuned_train_keys(pipeline)[0]
    for recipe in recipes(pipeline):
        cfg = _compose(root, pipeline, [f"{PIPELINES[pipeline].recipe_group}={recipe}", "experiment=adamw_decay"])
        horst, adamw = ((f"tuned/{pipeline}/{recipe}.yaml", arm) for arm in ("horst", "adamw"))
        assert cfg.optimizer.name == "adamw" and cfg.arm == "adamw_decay"
        matched = (
            (planted[(horst, "weight_decay")] + planted[(horst, "beta")]) * planted[(horst, lr)] / planted[(adamw, lr)]
        )
        assert cfg.optimizer.weight_decay == pytest.approx(matched, rel=1e-12)
        assert cfg.train[lr] == planted[(adamw, lr)]
        summed = _compose(
            root, pipeline, [f"{PIPELINES[pipeline].recipe_group}={recipe}", "optimizer=adamw", CONTROL_DECAY]
        )
        assert summed.optimizer.weight_decay == planted[(horst, "weight_decay")] + planted[(horst, "beta")]


def test_the_command_line_and_the_tuned_node_override_as_documented():
    """Later wins: the command line over the tuned file; `tuned.horst.alpha=` reaches HORST
    through its interpolation, and changes nothing for another optimizer."""
    assert _compose(CONFIGS, "vit", ["optimizer.alpha=5.0"]).optimizer.alpha == 5.0
    assert _compose(CONFIGS, "vit", ["tuned.horst.alpha=7.0"]).optimizer.alpha == 7.0
    ham = _compose(CONFIGS, "gpt2", ["optimizer=ham", "tuned.horst.alpha=7.0"])
    assert ham.optimizer.alpha == ham.tuned.ham.alpha != 7.0


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_the_where_from_printer_names_each_values_owner(pipeline):
    """`horst-sparse config` (horst_sparse.compose.where_from) gives each optimizer and schedule value
    the file this table says it comes from; an experiment's own values are the experiment's, the
    command line's are the command line's, and a value copied by interpolation names the key's file."""
    from horst_sparse.compose import COMMAND_LINE, where_from

    for recipe, optimizer in itertools.product(recipes(pipeline), TUNED_OPTIMIZERS):
        rows = where_from(
            PIPELINES[pipeline], [f"{PIPELINES[pipeline].recipe_group}={recipe}", f"optimizer={optimizer}"]
        )
        source = {key: (file, via) for key, _, file, via in rows}
        keys = [f"train.{k}" for k in tuned_train_keys(pipeline)] + [
            f"optimizer.{k}" for k in RECIPE_DEPENDENT if f"optimizer.{k}" in source
        ]
        for key in keys:
            file, section = owner(pipeline, recipe, optimizer, key)
            assert source[key][0] == file, f"{pipeline} {recipe} {optimizer}: {key}"
            assert source[key][1].endswith(f"-> tuned.{section}.{key.split('.')[1]}"), source[key]
    experiment, (_, recipe) = next((e, r) for e, r in experiments().items() if r[0] == pipeline)
    lr = PIPELINES[pipeline].configs.lr_key
    rows = {key: row for key, *row in where_from(PIPELINES[pipeline], [f"experiment={experiment}", f"{lr}=0.5"])}
    for key in experiment_values(experiment):
        if key != lr:
            assert rows[key][1] == f"experiment/{experiment}.yaml", key
    assert rows[lr][:2] == [0.5, COMMAND_LINE]


def test_horst_sparse_config_prints_the_source_of_the_keys_asked_for():
    """The README's `horst-sparse config` line, as written, and a wrong option's one line."""
    import re
    import shlex
    import subprocess
    import sys

    readme = (CONFIGS.parent / "README.md").read_text()
    command = shlex.split(re.search(r"`(horst-sparse config [^`]+)`", readme).group(1))
    shown = subprocess.run([sys.executable, "-m", "horst_sparse.cli", *command[1:]], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    lines = dict(line.split(None, 1) for line in shown.stdout.splitlines())
    assert command[1:] == ["config", "gpt2", "optimizer=horst", "train.lr", "optimizer.alpha"]
    assert set(lines) == {"optimizer.alpha", "train.lr"}
    assert lines["train.lr"].endswith(
        "tuned/gpt2/pydoc.yaml  (via gpt2_recipe/pydoc.yaml: ${hparams.lr} -> tuned.horst.lr)"
    )
    assert lines["optimizer.alpha"].endswith(
        "tuned/gpt2/pydoc.yaml  (via optimizer/horst.yaml: ${hparams.alpha} -> tuned.horst.alpha)"
    )
    wrong = subprocess.run(
        [sys.executable, "-m", "horst_sparse.cli", "config", "vit", "optimizer=horts"], capture_output=True, text=True
    )
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "optimizer=horst" in wrong.stderr
