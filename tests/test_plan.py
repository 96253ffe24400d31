"""scripts/plan.py on the real entry points and sweep presets: Hydra's own expansion (glob,
comma lists), every cell composed, the cost table's estimates, nothing submitted."""

from __future__ import annotations

import functools
import importlib.util
import itertools
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("plan", REPO / "scripts" / "plan.py")
plan = importlib.util.module_from_spec(_spec)
sys.modules["plan"] = plan  # dataclasses look their module up by name
_spec.loader.exec_module(plan)

# The one place for the sweep presets' sizes (configs/sweep/*.yaml): edit here when a sweep changes.
SWEEP_CELLS = {"deit_table": 27, "gpt2_table": 3, "horst_alpha_beta": 16, "ham_alpha_beta": 9, "vit_sparsity": 15}
# Each sweep as README "Reproducing the paper" launches it: (entry point, further overrides).
COMMANDS = {
    "deit_table": ("train_vit.py", ["data.root=/x", "hydra/launcher=slurm"]),
    "gpt2_table": ("train_gpt2.py", ["hydra/launcher=slurm_1gpu"]),
    "horst_alpha_beta": ("train_vit.py", []),
    "ham_alpha_beta": ("train_gpt2.py", ["experiment=gpt2_small_slimpajama", "hydra/launcher=slurm_1gpu"]),
    "vit_sparsity": ("train_vit.py", []),
}


@functools.cache
def planned(sweep: str):
    """(entry, multirun config, cells) of a sweep preset, launched as COMMANDS says; composing
    the 27 DeiT cells takes ~8 s on 2 cores, so each sweep is planned once."""
    script, extra = COMMANDS[sweep]
    return plan.plan(script, [f"+sweep={sweep}", *extra])


def test_every_sweep_preset_has_an_expected_size():
    assert set(SWEEP_CELLS) == {p.stem for p in (REPO / "configs" / "sweep").glob("*.yaml")} == set(COMMANDS)


@pytest.mark.parametrize("sweep", sorted(SWEEP_CELLS))
def test_sweep_preset_expands_to_its_cells_with_a_cost_each(sweep: str):
    _, _, cells = planned(sweep)
    assert len(cells) == SWEEP_CELLS[sweep]
    assert len({tuple(c.overrides) for c in cells}) == len(cells)  # no duplicates
    assert all(c.gpu_hours is not None and c.gpu for c in cells), [c.note for c in cells if c.gpu_hours is None]


def test_deit_table_cells_costs_and_launcher():
    entry, config, cells = planned("deit_table")
    out = plan.render(entry, config, cells, ["+sweep=deit_table", "data.root=/x", "hydra/launcher=slurm"])
    experiments = sorted(p.stem for p in (REPO / "configs" / "experiment").glob("deit_*_acdc_s*.yaml"))
    assert sorted((c.choices["experiment"], c.choices["optimizer"]) for c in cells) == sorted(
        itertools.product(experiments, ["adamw", "ham", "horst"])
    )  # glob(deit_*_acdc_s*) expanded over the experiment group, as Hydra does
    assert all(c.config.data.root == "/x" for c in cells)
    costs = yaml.safe_load((REPO / "configs" / "costs.yaml").read_text())["experiments"]
    total = sum(costs[e]["gpu_hours"] for e in experiments) * 3
    assert sum(c.gpu_hours for c in cells) == pytest.approx(total)
    assert "27 cells:" in out and f"total: 27 runs, {total:,.0f} V100-hours" in out
    assert "SlurmLauncher" in out and "one SLURM job array of 27 jobs" in out and "x 4 GPU(s)" in out
    assert "blocks until every job has ended" in out and "nothing was submitted" in out


def test_command_line_prints_the_plan(capsys):
    plan.main(["train_gpt2.py", "-m", "+sweep=gpt2_table", "hydra/launcher=slurm_1gpu"])
    out = capsys.readouterr().out
    assert out.startswith("plan: python train_gpt2.py -m +sweep=gpt2_table hydra/launcher=slurm_1gpu")
    assert "3 cells:" in out and "optimizer=horst" in out and "A100-40GB" in out
    assert "x 1 GPU(s)" in out and "nothing was submitted" in out


def test_cost_table_covers_every_experiment_preset():
    costs = yaml.safe_load((REPO / "configs" / "costs.yaml").read_text())
    for preset in (p.stem for p in (REPO / "configs" / "experiment").glob("*.yaml")):
        entry = costs["experiments"][preset]
        assert entry["gpu_hours"] > 0 and entry["gpu"], preset
    assert set(costs["embedded"]) == {"train_vit", "train_gpt2"}


def test_cost_scales_with_the_training_length():
    _, _, cells = plan.plan("train_vit.py", ["experiment=deit_small_acdc_s90", "optimizer=adamw,horst", "train.epochs=150"])
    costs = yaml.safe_load((REPO / "configs" / "costs.yaml").read_text())["experiments"]["deit_small_acdc_s90"]
    assert len(cells) == 2
    assert all(c.gpu_hours == pytest.approx(costs["gpu_hours"] / 2) for c in cells)
    assert all("train.epochs=150" in c.note for c in cells)


def test_a_cell_that_does_not_compose_fails_before_anything_runs():
    with pytest.raises(Exception, match="no_such_optimizer"):
        plan.plan("train_gpt2.py", ["optimizer=adamw,no_such_optimizer"])


def test_flags_other_than_multirun_are_refused():
    with pytest.raises(SystemExit, match="--cfg"):
        plan.main(["train_vit.py", "-m", "--cfg", "job"])
