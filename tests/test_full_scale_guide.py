"""docs/full_scale.md states what the code says: each output it quotes is what its command prints,
the tuning costs are horst-sparse tune's budget times the planner's cost of a run, the table of untuned
values is configs/tuned/'s, and the README states the same untuned values. (Its bash commands
are checked with the README's, tests/test_readme_commands.py; its preparation commands run on
miniatures in tests/test_prepare_imagenet.py and tests/test_gpt2_data.py.)"""

from __future__ import annotations

import math
import re
import shlex

import pytest
from conftest import ROOT

from horst_sparse import plan
from horst_sparse import tune as tuning

GUIDE = ROOT / "docs" / "full_scale.md"
README = ROOT / "README.md"
# the full-scale recipes, each with the experiment a tuning of it names
RECIPES = {"deit_imagenet": ("vit", "deit_small_acdc_s90"), "slimpajama": ("gpt2", "gpt2_small_slimpajama")}


def transcripts(text: str) -> list[tuple[str, list[str]]]:
    """The guide's ```text blocks: a `$ command` line, then lines of its output."""
    found = []
    for block in re.findall(r"```text\n(.*?)```", text, re.S):
        first, *lines = block.rstrip("\n").splitlines()
        assert first.startswith("$ "), first
        found.append((first[2:], lines))
    return found


def guide_commands(prefix: str, document=GUIDE) -> list[list[str]]:
    return [
        shlex.split(line.split("  #")[0])
        for block in re.findall(r"```bash\n(.*?)```", document.read_text(), re.S)
        for line in block.splitlines()
        if line.startswith(prefix)
    ]


TRANSCRIPTS = transcripts(GUIDE.read_text())


def test_the_guide_quotes_the_planner_for_both_tables_and_the_slimpajama_dry_run():
    commands = [command for command, _ in TRANSCRIPTS]
    assert any("+study=deit_table" in c for c in commands) and any("+study=gpt2_table" in c for c in commands)
    assert any(c.startswith("python scripts/prepare_slimpajama.py") and "--dry-run" in c for c in commands)


@pytest.mark.parametrize("command,quoted", TRANSCRIPTS, ids=[c for c, _ in TRANSCRIPTS])
def test_each_output_the_guide_quotes_is_what_its_command_prints(command, quoted, capsys):
    words = shlex.split(command)
    if words[:2] == ["horst-sparse", "plan"]:
        plan.main(words[2:])
    elif words[:2] == ["python", "scripts/prepare_slimpajama.py"]:
        from scripts import prepare_slimpajama

        prepare_slimpajama.main(words[2:])
    else:
        pytest.fail(f"the guide quotes {command!r}, which this test does not run")
    printed = capsys.readouterr().out.splitlines()
    missing = [line for line in quoted if line not in printed]
    assert not missing, "docs/full_scale.md quotes lines the command does not print; it prints:\n" + "\n".join(printed)


def _cost(runs: int, cell: plan.Cell) -> str:
    return f"{runs} runs, {runs * cell.gpu_hours:,.0f}-{runs * cell.gpu_hours_max:,.0f} {cell.gpu}-hours per arm"


def test_the_tuning_costs_are_horst_tunes_budget_times_the_planners_cost_of_one_run():
    text = " ".join(GUIDE.read_text().split())
    tunings = [w[1:] for w in guide_commands("horst-sparse tune ")]  # tune <pipeline> <arm> ...
    assert {(w[1], w[2]) for w in tunings} == {
        (p, arm) for p, _ in RECIPES.values() for arm in ("adamw", "ham", "horst")
    }
    for pipeline, experiment in RECIPES.values():
        words = next(w for w in tunings if w[1] == pipeline)
        overrides = [w for w in words[3:] if "=" in w]  # the Hydra overrides; not --out and its folder
        assert f"experiment={experiment}" in overrides
        prepared = tuning.prepare(pipeline, words[2], overrides=overrides, elsewhere="--out" in words)
        per_trial = len(tuning.cells(prepared.tune_over))
        runs = (tuning.DEFAULT_TRIALS + tuning.DEFAULT_TOP_K * tuning.DEFAULT_RERUN_SEEDS) * per_trial
        _, _, [cell] = plan.plan(ROOT / f"train_{pipeline}.py", [f"experiment={experiment}"])
        assert _cost(runs, cell) in text, _cost(runs, cell)


def _number(value) -> str:
    return "/".join(f"{v:g}" for v in value) if isinstance(value, list) else f"{value:g}"


def _values(node: dict) -> str:
    return ", ".join(f"{key} {_number(value)}" for key, value in node.items() if key != "provenance")


def _untuned(compose) -> dict[tuple[str, str], dict]:
    """(recipe, arm) -> the values a full-scale run composes, for every arm without provenance."""
    found = {}
    for recipe, (pipeline, experiment) in RECIPES.items():
        tuned = compose(pipeline, [f"experiment={experiment}"])["tuned"]
        for arm in ("adamw", "ham", "horst", "horst_prunable"):
            if tuned[arm]["provenance"] is None:
                found[(recipe, arm)] = tuned[arm]
    return found


def test_the_guides_table_of_untuned_values_is_configs_tuned(compose):
    rows = {
        tuple(cells[:2]): cells[2]
        for line in GUIDE.read_text().splitlines()
        if (cells := [c.strip() for c in line.strip("|").split("|")])[0] in RECIPES
    }
    untuned = _untuned(compose)
    assert set(rows) == set(untuned)  # an arm tuned at this scale leaves the table
    for key, values in untuned.items():
        assert rows[key] == _values(values), key


def test_the_search_spaces_hold_the_untuned_values(compose):
    """A tuning that starts from the published values can find them again."""
    for (recipe, arm), values in _untuned(compose).items():
        pipeline = RECIPES[recipe][0]
        space = tuning.prepare(pipeline, arm, overrides=[f"experiment={RECIPES[recipe][1]}"], elsewhere=True).space
        for key, bounds in space.items():
            low, high = map(float, re.search(r"interval\(([^,]+),\s*([^)]+)\)", bounds).groups())
            value = values[key.rsplit(".", 1)[-1]]
            assert low <= value <= high and math.isfinite(value), (recipe, arm, key, value, bounds)


def test_the_readme_states_the_untuned_values_and_points_to_the_guide(compose):
    cluster = README.read_text().split("## Reproducing the paper on a cluster")[1].split("\n## ")[0]
    assert "docs/full_scale.md" in cluster
    text = " ".join(cluster.split())
    for (recipe, arm), values in _untuned(compose).items():
        if "alpha" in values:
            assert f"alpha {values['alpha']:g}, beta {values['beta']:g}" in text, (recipe, arm)
    assert "horst-sparse tune" in text and "provenance: null" in text


@pytest.mark.parametrize("document", [GUIDE, README], ids=["guide", "readme"])
def test_the_full_scale_tuning_commands_pass_horst_tunes_checks(document):
    """Composed with the search space and checked as horst-sparse tune checks before its first trial."""
    commands = [  # tune <pipeline> <arm> ...
        w[1:] for w in guide_commands("horst-sparse tune ", document) if any(o.startswith("experiment=") for o in w)
    ]
    assert commands
    for words in commands:
        assert "--out" in words  # the experiment's model is a change to the recipe: the pick goes to a folder
        overrides = [w for w in words[3:] if "=" in w]
        prepared = tuning.prepare(words[1], words[2], overrides=overrides, elsewhere=True)
        assert prepared.recipe in RECIPES and RECIPES[prepared.recipe][0] == words[1]
        with pytest.raises(tuning.TuningError, match="change the recipe's training"):
            tuning.prepare(words[1], words[2], overrides=overrides)
