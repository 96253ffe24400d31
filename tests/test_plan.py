"""horst-sparse plan on the real entry points and sweep presets: Hydra's expansion (glob, comma
lists) through its public API, every cell composed and checked as its run would check it,
the cost table's ranges, nothing submitted; and the commands a new user types first."""

from __future__ import annotations

import functools
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from horst_sparse import plan
from horst_sparse.compose import sweep_jobs
from horst_sparse.vit.data import IMAGENET_LAYOUT

REPO = Path(__file__).resolve().parents[1]

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
    return plan.plan(script, [f"+study={sweep}", *extra])


def test_every_sweep_preset_has_an_expected_size():
    sweeps = {
        p.stem for p in (REPO / "configs" / "study").glob("*.yaml") if not p.stem.startswith(("demo_", "embedded_"))
    }
    assert set(SWEEP_CELLS) == sweeps == set(COMMANDS)


@pytest.mark.parametrize("sweep", sorted(SWEEP_CELLS))
def test_sweep_preset_expands_to_its_cells_with_a_cost_each(sweep: str):
    _, _, cells = planned(sweep)
    assert len(cells) == SWEEP_CELLS[sweep]
    assert len({tuple(c.overrides) for c in cells}) == len(cells)  # no duplicates
    assert all(c.gpu_hours is not None and c.gpu for c in cells), [c.note for c in cells if c.gpu_hours is None]


def test_deit_table_cells_costs_and_launcher():
    entry, config, cells = planned("deit_table")
    out = plan.render(
        entry, config, cells, ["+study=deit_table", "data.root=/x", "hydra/launcher=slurm"], data_checked=False
    )
    experiments = sorted(p.stem for p in (REPO / "configs" / "experiment").glob("deit_*_acdc_s*.yaml"))
    assert sorted((c.choices["experiment"], c.choices["optimizer"]) for c in cells) == sorted(
        itertools.product(experiments, ["adamw", "ham", "horst"])
    )  # glob(deit_*_acdc_s*) expanded over the experiment group, as Hydra does
    assert all(c.config.data.root == "/x" for c in cells)
    costs = yaml.safe_load((REPO / "configs" / "costs.yaml").read_text())["experiments"]
    low = sum(costs[e]["gpu_hours"] for e in experiments) * 3
    high = sum(costs[e].get("gpu_hours_max", costs[e]["gpu_hours"]) for e in experiments) * 3
    assert sum(c.gpu_hours for c in cells) == pytest.approx(low) and high > low  # DeiT-S/Ti: lower bounds
    assert "27 cells:" in out and f"total: 27 runs, {low:,.0f}-{high:,.0f} V100-hours" in out
    assert "the range assumes:" in out and "lower bound" in out and "(data paths not checked" in out
    assert "SlurmLauncher" in out and "one SLURM job array of 27 jobs" in out and "x 4 GPU(s)" in out
    assert "nothing was submitted" in out
    # The same table without a dataset: every cell refused, in one line (the line main prints)
    assert plan.check(entry, cells) == [
        f"every cell (27): data.root=/x does not exist or is not a folder; {IMAGENET_LAYOUT}"
    ]
    assert plan.check(entry, cells, data=False) == []


def test_command_line_prints_the_plan(capsys):
    plan.main(["train_gpt2.py", "-m", "+study=gpt2_table", "hydra/launcher=slurm_1gpu", "--no-data-check"])
    out = capsys.readouterr().out
    assert out.startswith("plan: python train_gpt2.py -m +study=gpt2_table hydra/launcher=slurm_1gpu\n")
    assert "3 cells:" in out and "optimizer=horst" in out and "6.5-13.0 A100-40GB" in out
    assert "compile" in out.split("the range assumes:")[1]  # nanoGPT's time is with torch.compile
    assert "x 1 GPU(s)" in out and "nothing was submitted" in out


def test_cost_table_covers_every_experiment_preset():
    costs = yaml.safe_load((REPO / "configs" / "costs.yaml").read_text())
    experiments = [
        p for p in (REPO / "configs" / "experiment").glob("*.yaml") if "pipeline" in yaml.safe_load(p.read_text())
    ]
    assert len(experiments) == 12  # an arm (no `pipeline:`) costs what the run it labels costs
    for preset in (p.stem for p in experiments):
        entry = costs["experiments"][preset]
        assert entry["gpu_hours"] > 0 and entry["gpu"] or entry["gpu"] == "CPU" and entry["cpu_minutes"] > 0, preset
    assert set(costs["embedded"]) == {"train_vit", "train_gpt2"}


def test_cost_scales_with_the_training_length():
    _, _, cells = plan.plan(
        "train_vit.py", ["experiment=deit_small_acdc_s90", "optimizer=adamw,horst", "train.epochs=150"]
    )
    costs = yaml.safe_load((REPO / "configs" / "costs.yaml").read_text())["experiments"]["deit_small_acdc_s90"]
    assert len(cells) == 2
    assert all(c.gpu_hours == pytest.approx(costs["gpu_hours"] / 2) for c in cells)
    assert all("train.epochs=150" in c.note for c in cells)


def test_a_cell_that_does_not_compose_is_one_line_naming_it(capsys):
    with pytest.raises(SystemExit) as stop:
        plan.main(["train_gpt2.py", "-m", "optimizer=adamw,no_such_optimizer"])
    # an option its group does not have is named before any cell is expanded
    assert str(stop.value.code).startswith("error: optimizer=no_such_optimizer: optimizer has no option ")
    assert "\n" not in str(stop.value.code) and "adamw, ham, horst" in str(stop.value.code)


def test_the_expansion_is_hydras_basic_sweepers():
    """The cells of a command line with a sweep preset, a list, a range and a key given twice
    are those Hydra's own basic sweeper would launch, in its order (its implementation is the
    reference here; horst_sparse.compose uses only the public parser)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    arguments = [
        "optimizer=horst",
        "acdc.sparsity=0.5,0.9",
        "seed=range(0,3)",
        "optimizer=adamw,horst",
        "train.epochs=40",
    ]
    reference = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(arguments), None)
    assert sweep_jobs(arguments) == [list(job) for batch in reference for job in batch]
    _, _, cells = plan.plan("train_vit.py", arguments)
    assert len(cells) == 2 * 2 * 3 and cells[0].overrides == [
        "optimizer=adamw",
        "acdc.sparsity=0.5",
        "seed=0",
        "train.epochs=40",
    ]
    assert [c.config.optimizer.name for c in cells[:2]] == ["adamw", "adamw"] and cells[-1].config.acdc.sparsity == 0.9


# ---- the commands a new user types -------------------------------------------------------


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    """plan.py's main: (exit status, stdout, stderr with the exit message)."""
    try:
        plan.main(list(argv))
        code, message = 0, ""
    except SystemExit as stop:
        code, message = (1, str(stop.code)) if isinstance(stop.code, str) else (stop.code or 0, "")
    out, err = capsys.readouterr()
    return code, out, err + message


def test_a_plain_multirun_is_planned(capsys):
    code, out, err = run_main(capsys, "train_vit.py", "-m", "optimizer=adamw,horst", "seed=0,1")
    assert code == 0, err
    assert (
        "4 cells:" in out
        and "optimizer=horst seed=1" in out
        and "every cell passed the pipeline's start-up checks" in out
    )
    assert "total: 4 runs, 0 GPU-hours (and 4 CPU runs" in out


@pytest.mark.parametrize(
    "arguments,lines",
    [
        (["train.base_lr=-1", "optimizer=adamw,horst"], ["error: every cell (2): train.base_lr=-1.0 must be positive"]),
        (["acdc.sparsity=0.5,1.5"], ["error: cell 1 (acdc.sparsity=1.5): acdc.sparsity=1.5 must be in [0, 1)"]),
        (
            ["acdc.sparsity=1.5", "optimizer=adamw"],
            ["error: cell 0 (acdc.sparsity=1.5 optimizer=adamw): acdc.sparsity=1.5 must be in [0, 1)"],
        ),
        (
            ["experiment=deit_small_acdc_s90", "optimizer=adamw,horst"],
            ["error: every cell (2): data.root is not set; pass data.root="],
        ),
        (
            ['acdc.patterns=["2:4"]'],
            [
                "error: cell 0 (acdc.patterns=[\"2:4\"]): acdc.patterns has '2:4', but acdc.patterns are "
                'module-name regexes added to the prunable set; for 2:4 masks use acdc.pattern="2:4" '
                "acdc.sparsity=0.5"
            ],
        ),
        (
            ["acdc.patterns=[blocks.0.attn.qkvv]"],
            [
                "error: cell 0 (acdc.patterns=[blocks.0.attn.qkvv]): acdc.patterns has "
                "'blocks.0.attn.qkvv', which matches no prunable layer of the model"
            ],
        ),
    ],
)
def test_cells_that_would_fail_are_refused_one_line_each(capsys, arguments, lines):
    code, out, err = run_main(capsys, "train_vit.py", "-m", *arguments)
    assert code == 1 and out == ""
    shown = err.strip().splitlines()
    assert len(shown) == len(lines) + 1 and shown[-1].startswith("refused: ")
    assert all(line.startswith(expected) for line, expected in zip(shown, lines)), shown


def test_a_misspelt_key_is_one_line_with_did_you_mean(capsys):
    code, out, err = run_main(capsys, "train_vit.py", "-m", "train.bse_lr=1e-3", "seed=0,1")
    assert (code, out, err) == (1, "", "error: train.bse_lr is not a setting; did you mean train.base_lr?")
    code, _, err = run_main(capsys, "train_gpt2.py", "optimizer=adamw,horst", "trian.lr=1")
    assert err == "error: trian.lr is not a setting; did you mean train?"


def test_deit_cells_with_their_imagenet_are_planned_and_a_missing_dataset_refused(capsys, tmp_path: Path):
    for split in ("train", "val"):
        (tmp_path / split / "n01440764").mkdir(parents=True)
    code, out, err = run_main(
        capsys,
        "train_vit.py",
        "-m",
        "experiment=deit_tiny_acdc_s90",
        "optimizer=adamw,horst",
        f"data.root={tmp_path}",
        "hydra/launcher=slurm",
    )
    assert code == 0, err
    assert "2 cells:" in out and "with 4 process(es) per job" in out and "total: 2 runs, 98-576 V100-hours" in out
    code, out, err = run_main(capsys, "train_gpt2.py", "-m", "+study=gpt2_table", f"data.dir={tmp_path / 'none'}")
    assert code == 1 and f"error: every cell (3): no prepared tokens at {tmp_path / 'none'}" in err


def test_flags_other_than_multirun_are_refused():
    with pytest.raises(SystemExit, match="--cfg"):
        plan.main(["train_vit.py", "-m", "--cfg", "job"])


@pytest.mark.parametrize("typed", [["horst-sparse", "plan"], ["python", "-m", "horst_sparse.cli", "plan"]])
def test_the_last_line_names_the_planner_as_typed(typed):
    """Typed as a user types it: the console script found on PATH (the venv's bin/ first, as
    `source .venv/bin/activate` puts it), or the command's module with -m."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        [*typed, "train_vit.py", "-m", "optimizer=adamw,horst"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "plan: python train_vit.py -m optimizer=adamw,horst"
    assert lines[-1] == (
        f"nothing was submitted ({' '.join(typed)} only plans); to launch, run the command of the plan: line above"
    )


# ---- a CPU job on SLURM: one task, its CPUs and memory against the partition's nodes ----------

# `sinfo -h -N -o "%P %c %m"` of a cluster with a default CPU partition of 8-CPU, 16000 MB nodes
# and a GPU partition of 64-CPU, 512000 MB nodes.
SINFO = "cpu* 8 16000\ncpu* 8 16000\ngpu 64 512000\n"


def test_a_cpu_job_of_the_gpu_preset_is_planned_as_one_task(capsys):
    """`gpus_per_node=0` with the 4-GPU preset: its `tasks_per_node: ${.gpus_per_node}` is 0, and
    the launcher submits one task; the plan checks the cells with that one process (it once
    divided the batch by 0 processes: ZeroDivisionError)."""
    code, out, err = run_main(
        capsys, "train_gpt2.py", "-m", "optimizer=adamw,horst", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0"
    )
    assert code == 0, err
    assert "with 1 process(es) per job" in out and "x 0 GPU(s), 1 task(s) per node" in out
    assert "per task: 12 CPU(s), 256 GB; per node (1 task(s)): 12 CPU(s), 256 GB" in out


def test_the_plan_prints_cpus_and_memory_per_task_and_warns_where_no_node_has_them():
    from omegaconf import OmegaConf

    def lines(**launcher) -> list[str]:
        preset = {"gpus_per_node": 0, "tasks_per_node": 1, "cpus_per_task": 2, "mem_gb": 4, "partition": None}
        return plan.resources_lines(OmegaConf.create({**preset, **launcher}), SINFO)

    assert lines() == [
        "  per task: 2 CPU(s), 4 GB; per node (1 task(s)): 2 CPU(s), 4 GB "
        "(hydra.launcher.cpus_per_task=2, hydra.launcher.mem_gb=4 per node)"
    ]
    (_, warning) = lines(cpus_per_task=12, mem_gb=256)
    assert warning == (
        "  warning: each job asks 12 CPU(s) and 256 GB per node, more than any node of partition cpu (the default) "
        "has (8 CPUs and 15.6 GB; sinfo): it would pend forever (PartitionConfig) or be refused; lower "
        "hydra.launcher.cpus_per_task and hydra.launcher.mem_gb (or use hydra/launcher=slurm_cpu)"
    )
    assert lines(mem_gb=16)[1].endswith("; lower hydra.launcher.mem_gb (or use hydra/launcher=slurm_cpu)")
    # 4 tasks of 12 CPUs, 64 GB each: 48 CPUs and 256 GB per node, which the GPU nodes have
    assert len(lines(gpus_per_node=4, tasks_per_node=4, cpus_per_task=12, mem_gb=256, partition="gpu")) == 1
    assert (
        "per task: 12 CPU(s), 64 GB; per node (4 task(s)): 48 CPU(s), 256 GB"
        in lines(gpus_per_node=4, tasks_per_node=4, cpus_per_task=12, mem_gb=256, partition="gpu")[0]
    )
    assert lines(gpus_per_node=4, tasks_per_node=4, cpus_per_task=12, partition="cpu")[1].endswith(
        "lower hydra.launcher.cpus_per_task"
    )  # a GPU job: no CPU preset to suggest
    assert lines(partition="nope")[1] == "  (not checked against the partition's nodes: sinfo lists no partition nope)"
    assert lines(mem_gb=None)[0].startswith("  per task: 2 CPU(s), default memory;") and len(lines(mem_gb=None)) == 1


def test_the_cpu_preset_is_planned_within_a_cpu_node():
    entry, config, cells = plan.plan("train_vit.py", ["optimizer=adamw,horst", "hydra/launcher=slurm_cpu"])
    out = plan.render(entry, config, cells, ["optimizer=adamw,horst", "hydra/launcher=slurm_cpu"], sinfo=SINFO)
    assert "launcher: slurm_cpu" in out and "x 0 GPU(s), 1 task(s) per node" in out
    assert "per task: 2 CPU(s), 4 GB" in out and "warning" not in out
