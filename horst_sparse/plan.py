"""What a multirun would launch, and what it would cost, without launching anything.

    horst-sparse plan train_vit.py -m optimizer=adamw,horst seed=0,1
    horst-sparse plan train_vit.py -m +study=deit_table data.root=/x hydra/launcher=slurm
    horst-sparse plan train_gpt2.py -m +study=gpt2_table hydra/launcher=slurm_1gpu

Give the entry point and the same arguments as for the real multirun (`-m` may be left out).
The entry point names its pipeline (horst_sparse.pipeline's registry: its primary config, its
schemas, its checks). The command line is expanded as Hydra's basic sweeper expands it (the
sweep preset's `hydra.sweeper.params`, then the command line's overrides; `a,b,c`,
`range(...)`, `glob(...)` over a config group's options; the product of all) and every cell is
composed as its job would be (horst_sparse.compose). Then each cell goes through the
pipeline's own checks (the ones a run makes at start-up, with the launcher's process count)
and its data-path checks (`--no-data-check` where the data exist only on the compute nodes).
A cell that would fail is refused, one line each, and nothing is planned.

Printed: the cells (their sweep overrides, experiment preset, estimated GPU-hours), the
launcher with the resources of one job, the total GPU-hours as a range, and the assumptions
behind the range. The estimates come from `configs/costs.yaml` (GPU-hours per run of each
experiment preset, with a lower and an upper figure and their sources), scaled linearly by
the cell's training length where it differs from the preset's (`train.epochs` for ViT,
`train.max_steps` x `train.batch_size` for GPT-2).

`plan(script, overrides)` is the same for other code: the pipeline, the multirun's base config
and its composed cells with their costs.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from horst_sparse.compose import ComposeError, expand
from horst_sparse.paths import CONFIGS
from horst_sparse.pipeline import Pipeline, UnknownPipeline, by_script, every

COSTS = CONFIGS / "costs.yaml"
MULTIRUN_FLAGS = ("-m", "--multirun")


class PlanError(RuntimeError):
    """A command line that cannot be planned; the message is the lines to print."""


@dataclass
class Cell:
    overrides: list[str]  # the job's sweep overrides, as Hydra passes them
    choices: dict[str, Any]  # hydra.runtime.choices: the config group options composed
    config: Any  # the job's config (DictConfig), hydra node included
    gpu_hours: float | None = None  # the cost table's lower figure, scaled to the cell
    gpu_hours_max: float | None = None  # its upper figure
    gpu: str | None = None
    cpu_minutes: float = 0.0  # the embedded defaults: CPU time instead of GPU-hours
    assumption: str = ""  # what the cost range assumes (costs.yaml)
    note: str = ""


# ----------------------------------------------------------------------------- checks


def job_config(cell: Cell) -> Any:
    """The cell's config without its hydra node, as the run sees it (`${hydra:...}` resolvable)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    HydraConfig.instance().set_config(cell.config)
    config = cell.config.copy()
    with open_dict(config):
        del config["hydra"]
    return config


def tasks_per_node(launcher: Any) -> int:
    """The tasks of one job on each node, as the SLURM launcher submits them: the presets tie
    them to the GPUs (`${.gpus_per_node}`), and a CPU job (no GPU) is one task, never 0."""
    tasks = int(launcher.get("tasks_per_node") or 0)
    return tasks if launcher.get("gpus_per_node") else max(tasks, 1)


def world_size(config: Any) -> int:
    """The processes of one job: the launcher's nodes x tasks per node (1: Hydra's basic
    launcher; a torchrun launch is planned per process count by the user)."""
    launcher = config.hydra.launcher
    if "tasks_per_node" not in launcher:
        return 1
    return int(launcher.get("nodes") or 1) * tasks_per_node(launcher)


def check(pipeline: Pipeline, cells: list[Cell], *, data: bool = True) -> list[str]:
    """One line per problem that would stop cells at start-up, naming the cells; [] if none."""
    from horst_sparse.training.config import RunError

    problems: dict[str, list[int]] = {}
    for num, cell in enumerate(cells):
        try:
            config = job_config(cell)
            pipeline.checks.config(config, world_size=world_size(cell.config))
            if data:
                pipeline.checks.data(config)
        except RunError as error:
            problems.setdefault(str(error), []).append(num)
    lines = []
    for message, nums in problems.items():
        if len(nums) == len(cells) > 1:
            where = f"every cell ({len(cells)})"
        elif len(nums) == 1:
            cell = cells[nums[0]]
            where = f"cell {nums[0]} ({' '.join(_varying(cells, cell) or cell.overrides) or 'no overrides'})"
        else:
            where = f"cells {', '.join(map(str, nums))}"
        lines.append(f"{where}: {message}")
    return lines


# ------------------------------------------------------------------------------ costs


def load_costs(path: Path = COSTS) -> dict[str, Any]:
    if not path.is_file():
        raise PlanError(f"no cost table at {path}")
    return yaml.safe_load(path.read_text())


def _select(config: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, key, default=None, throw_on_missing=False)


def estimate(cell: Cell, costs: dict[str, Any], config_name: str) -> None:
    """Fill the cell's cost from the cost table: the experiment preset's entry (the embedded
    default's where no experiment is chosen), scaled by the training length."""
    experiment = cell.choices.get("experiment")
    entry = costs.get("experiments", {}).get(experiment) if experiment else costs.get("embedded", {}).get(config_name)
    if entry is None:
        cell.note = f"no entry for {'experiment ' + str(experiment) if experiment else config_name} in costs.yaml"
        return
    scale, notes = 1.0, []
    for key in ("train.epochs", "train.max_steps", "train.batch_size"):
        reference = entry.get(key)
        value = _select(cell.config, key)
        if reference and value and value != reference:
            scale *= value / reference
            notes.append(f"{key}={value} (costs.yaml: {reference})")
    model = entry.get("model")
    if model and cell.choices.get("model") not in (None, model):
        notes.append(f"model={cell.choices.get('model')}, but the cost is {model}'s")
    cell.gpu_hours = float(entry["gpu_hours"]) * scale
    cell.gpu_hours_max = float(entry.get("gpu_hours_max", entry["gpu_hours"])) * scale
    cell.gpu = entry["gpu"]
    cell.cpu_minutes = float(entry.get("cpu_minutes", 0.0)) * scale
    cell.assumption = entry.get("assumption", "")
    cell.note = "; ".join(notes)


# ---------------------------------------------------------------------------- printing


def _hours(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _range(low: float, high: float) -> str:
    """`low-high` in the precision of the larger."""
    if _hours(low) == _hours(high):
        return _hours(low)
    return f"{low:,.0f}-{high:,.0f}" if high >= 100 else f"{low:.1f}-{high:.1f}"


def _varying(cells: list[Cell], cell: Cell) -> list[str]:
    """The cell's overrides whose key takes more than one value over the cells."""
    keys = {o.split("=", 1)[0] for c in cells for o in c.overrides}
    varying = {k for k in keys if len({o for c in cells for o in c.overrides if o.split("=", 1)[0] == k}) > 1}
    return [o for o in cell.overrides if o.split("=", 1)[0] in varying]


def partition_nodes(partition: str | None, sinfo: str | None = None) -> tuple[str, set[tuple[int, int]]] | str:
    """(partition, the (CPUs, memory in MB) of its nodes) for `partition` (the default one,
    marked `*`, where None), from `sinfo -h -N -o "%P %c %m"` (a line per node and partition;
    `sinfo` gives that text instead of running it); else why that cannot be told, in words."""
    import subprocess

    if sinfo is None:
        try:
            result = subprocess.run(["sinfo", "-h", "-N", "-o", "%P %c %m"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"sinfo did not answer ({type(error).__name__})"
        if result.returncode:
            return f"sinfo failed: {result.stderr.strip() or result.returncode}"
        sinfo = result.stdout
    nodes: dict[str, set[tuple[int, int]]] = {}
    default = None
    for line in sinfo.splitlines():
        fields = line.split()
        if len(fields) != 3:
            continue
        name, cpus, memory = fields
        if name.endswith("*"):
            name = default = name[:-1]
        nodes.setdefault(name, set()).add((int(cpus.rstrip("+")), int(memory.rstrip("+"))))
    name = partition or default
    if name not in nodes:
        return f"sinfo lists no partition {name}" if name else "sinfo names no default partition"
    return name, nodes[name]


def resources_lines(launcher: Any, sinfo: str | None = None) -> list[str]:
    """What one job asks, per task and per node, and a one-line warning where no node of the
    partition has the CPUs and the memory a job's node needs: SLURM would hold the job pending
    forever (`PartitionConfig`) or refuse it."""
    tasks, cpus, mem_gb = tasks_per_node(launcher), launcher.get("cpus_per_task") or 1, launcher.get("mem_gb")
    task_memory, node_memory = (f"{mem_gb / tasks:g} GB", f"{mem_gb:g} GB") if mem_gb else ("default memory",) * 2
    lines = [
        f"  per task: {cpus} CPU(s), {task_memory}; per node ({tasks} task(s)): {tasks * cpus} CPU(s), {node_memory} "
        f"(hydra.launcher.cpus_per_task={cpus}, hydra.launcher.mem_gb={mem_gb} per node)"
    ]
    found = partition_nodes(launcher.get("partition"), sinfo)
    if isinstance(found, str):
        return [*lines, f"  (not checked against the partition's nodes: {found})"]
    partition, nodes = found
    need_cpus, need_mb = tasks * cpus, (mem_gb or 0) * 1024  # sbatch's GB are 1024 MB; sinfo's memory is in MB
    if any(c >= need_cpus and m >= need_mb for c, m in nodes):
        return lines
    over = [
        key
        for key, too_much in (
            ("hydra.launcher.cpus_per_task", need_cpus > max(c for c, _ in nodes)),
            ("hydra.launcher.mem_gb", need_mb > max(m for _, m in nodes)),
        )
        if too_much
    ] or ["hydra.launcher.cpus_per_task", "hydra.launcher.mem_gb"]  # each fits some node, both none
    has = ", ".join(f"{c} CPUs and {m / 1024:.1f} GB" for c, m in sorted(nodes, reverse=True)[:3])
    lines.append(
        f"  warning: each job asks {need_cpus} CPU(s) and {node_memory} per node, more than any node of partition "
        f"{partition}{'' if launcher.get('partition') else ' (the default)'} has ({has}; sinfo): it would pend "
        f"forever (PartitionConfig) or be refused; lower {' and '.join(over)}"
        + ("" if launcher.get("gpus_per_node") else " (or use hydra/launcher=slurm_cpu)")
    )
    return lines


def launcher_lines(config: Any, cells: list[Cell], sinfo: str | None = None) -> list[str]:
    launcher = config.hydra.launcher
    choice = (cells[0].choices if cells else {}).get("hydra/launcher") or "basic"
    target = str(launcher.get("_target_", "?"))
    lines = [f"launcher: {choice} ({target})"]
    if "SlurmLauncher" in target:
        nodes, gpus = launcher.get("nodes", 1), launcher.get("gpus_per_node") or 0
        timeout_h = launcher.get("timeout_min", 0) / 60
        lines.append(
            f"  one SLURM job array of {len(cells)} jobs (at most {launcher.get('array_parallelism')} at once); "
            f"each job {nodes} node(s) x {gpus} GPU(s), {tasks_per_node(launcher)} task(s) per node, "
            f"time limit {timeout_h:g} h, requeued up to {launcher.get('max_num_timeout')} times on time-out; "
            f"partition {launcher.get('partition')}, account {launcher.get('account')} "
            "(set with hydra.launcher.partition=... hydra.launcher.account=...)"
        )
        lines += resources_lines(launcher, sinfo)
        per_job = nodes * gpus
        longest = max((c.gpu_hours_max for c in cells if c.gpu_hours_max is not None), default=None)
        if per_job and longest:
            wall = longest / per_job
            lines.append(
                f"  longest job: up to ~{_hours(wall)} h of wall-clock on {per_job} GPU(s) of the cost table's kind"
                + (
                    f" = {math.ceil(wall / timeout_h)} time slots of {timeout_h:g} h (checkpoint and requeue)"
                    if timeout_h and wall > timeout_h
                    else ""
                )
            )
    elif "LocalLauncher" in target:
        lines.append(f"  submitit's local executor: {len(cells)} subprocesses on this machine")
    elif "JoblibLauncher" in target:
        lines.append(
            f"  joblib: the {len(cells)} cells in {launcher.get('n_jobs')} processes side by side on this machine"
        )
    else:
        lines.append(f"  Hydra's basic launcher: the {len(cells)} cells one after another in this process")
    return lines


def render(
    pipeline: Pipeline,
    config: Any,
    cells: list[Cell],
    command: Sequence[str],
    *,
    data_checked: bool = True,
    sinfo: str | None = None,
    prog: str = "horst-sparse plan",
) -> str:
    """The plan as printed; `sinfo`: the output of `sinfo -h -N -o "%P %c %m"` (None: run it);
    `prog`: the planner as it was typed (`horst_sparse.cli.typed`), which the last line names."""
    params = config.hydra.sweeper.get("params") or {}
    fixed = [o for o in (cells[0].overrides if cells else []) if o not in _varying(cells, cells[0])]
    lines = [
        "plan: python " + " ".join([pipeline.script, "-m", *command]),
        "sweep params (hydra.sweeper.params): " + (", ".join(f"{k}: {v}" for k, v in params.items()) or "none"),
        "the same in every cell: " + (" ".join(fixed) or "nothing"),
        f"every cell passed the pipeline's start-up checks with {world_size(config)} process(es) per job"
        + ("" if data_checked else " (data paths not checked: --no-data-check)"),
        "",
        f"{len(cells)} cells:",
    ]
    rows = [("#", "cell overrides", "experiment", "est. GPU-h")]
    for i, cell in enumerate(cells):
        if cell.gpu_hours is None:
            cost = "?"
        elif cell.gpu == "CPU":
            cost = f"0 (CPU, ~{cell.cpu_minutes:g} min)"
        else:
            cost = f"{_range(cell.gpu_hours, cell.gpu_hours_max)} {cell.gpu}"
        mine = " ".join(_varying(cells, cell)) or "(none)"
        rows.append(
            (
                str(i),
                mine,
                str(cell.choices.get("experiment") or "(embedded default)"),
                cost + (f"  [{cell.note}]" if cell.note else ""),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines += ["  " + "  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    lines.append("")
    low: dict[str, float] = {}
    high: dict[str, float] = {}
    for cell in cells:
        if cell.gpu_hours is not None and cell.gpu != "CPU":
            low[cell.gpu] = low.get(cell.gpu, 0.0) + cell.gpu_hours
            high[cell.gpu] = high.get(cell.gpu, 0.0) + cell.gpu_hours_max
    unknown = sum(c.gpu_hours is None for c in cells)
    cpu = [c for c in cells if c.gpu == "CPU"]
    total = " + ".join(f"{_range(low[gpu], high[gpu])} {gpu}-hours" for gpu in low) or "0 GPU-hours"
    if cpu:
        total += f" (and {len(cpu)} CPU runs, ~{sum(c.cpu_minutes for c in cpu):g} CPU-minutes)"
    lines.append(
        f"total: {len(cells)} runs, {total} (estimate from configs/costs.yaml)"
        + (f"; {unknown} cells without a cost entry not counted" if unknown else "")
    )
    assumptions = list(dict.fromkeys(c.assumption for c in cells if c.assumption))
    if assumptions:
        lines.append("the range assumes:")
        lines += [f"  - {a}" for a in assumptions]
    lines += launcher_lines(config, cells, sinfo)
    lines.append(f"nothing was submitted ({prog} only plans); to launch, run the command of the plan: line above")
    return "\n".join(lines)


def plan(
    script: str | Path, overrides: Sequence[str], *, costs: Path = COSTS, config_dir: Path = CONFIGS
) -> tuple[Pipeline, Any, list[Cell]]:
    """(pipeline, base config, cells with their costs) of a multirun command line; the keys are
    checked for misspellings first (`horst_sparse.training.presets.misspelt_key`)."""
    from omegaconf import OmegaConf

    from horst_sparse.training.presets import misspelt_key, unknown_option

    try:
        pipeline = by_script(str(script))
    except UnknownPipeline as error:
        raise PlanError(str(error)) from None
    pipeline.configs.register()
    problem = misspelt_key(pipeline.name, overrides) or unknown_option(list(overrides))
    if problem:
        raise PlanError(problem)
    try:
        config, jobs = expand(pipeline, overrides, config_dir=config_dir)
    except ComposeError as error:
        raise PlanError(str(error)) from None
    cells = [Cell(job, OmegaConf.to_container(composed.hydra.runtime.choices), composed) for job, composed in jobs]
    table = load_costs(costs)
    for cell in cells:
        estimate(cell, table, pipeline.config_name)
    return pipeline, config, cells


def main(argv: Sequence[str] | None = None) -> None:
    from horst_sparse.cli import typed

    prog = typed("plan")
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--costs", default=str(COSTS), help="cost table (default %(default)s)")
    parser.add_argument(
        "--no-data-check",
        action="store_true",
        help="skip the data-path checks (the data exist only where the jobs run, e.g. per-job staging)",
    )
    parser.add_argument("script", help="a pipeline's entry point: " + ", ".join(p.script for p in every()))
    parser.add_argument(
        "overrides", nargs=argparse.REMAINDER, help="the multirun's arguments (Hydra overrides; -m optional)"
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    own = [a for a in argv if a == "--no-data-check"]  # may follow the entry point, with the overrides
    args = parser.parse_args([*own, *(a for a in argv if a not in own)])
    overrides = [o for o in args.overrides if o not in MULTIRUN_FLAGS]
    flags = [o for o in overrides if o.startswith("-")]
    if flags:
        sys.exit(f"error: {prog} takes Hydra overrides only (and -m), not {' '.join(flags)}")
    try:
        pipeline, config, cells = plan(args.script, overrides, costs=Path(args.costs))
    except PlanError as error:
        sys.exit(f"error: {error}")
    problems = check(pipeline, cells, data=not args.no_data_check)
    if problems:
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        sys.exit("refused: the cells above would fail at start-up; fix them, nothing was planned")
    print(render(pipeline, config, cells, overrides, data_checked=not args.no_data_check, prog=prog))


if __name__ == "__main__":
    main()
