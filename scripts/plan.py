"""What a multirun would launch, and what it would cost, without launching anything.

    python scripts/plan.py train_vit.py -m +sweep=deit_table data.root=/x hydra/launcher=slurm
    python scripts/plan.py train_gpt2.py -m +sweep=gpt2_table hydra/launcher=slurm_1gpu
    python scripts/plan.py train_vit.py -m +sweep=horst_alpha_beta seed=0,1

Give the entry point and the same arguments as for the real multirun (`-m` may be left out).
The entry point is imported, not run: its `@hydra.main` names the config folder and primary
config, and its import registers the config schemas. Then Hydra composes the multirun config
(`compose_config(..., RunMode.MULTIRUN)`), the sweep's `hydra.sweeper.params` and the command
line's overrides go through Hydra's own `OverridesParser` (which expands `glob(...)` over a
config group's options, `range(...)`, `a,b,c`) and `BasicSweeper.split_arguments`, and every
cell is composed as Hydra would compose its job (`ConfigLoader.load_sweep_config`), so a cell
that would fail to compose fails here, before anything is submitted.

Printed: the cells (their sweep overrides, experiment preset, estimated GPU-hours), their
count, the launcher with the resources of one job, and the total GPU-hours. The estimates come
from `configs/costs.yaml` (GPU-hours per run of each experiment preset, each number with its
source), scaled linearly by the cell's training length where it differs from the preset's
(`train.epochs` for ViT, `train.max_steps` x `train.batch_size` for GPT-2).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import yaml

REPO = Path(__file__).resolve().parents[1]
COSTS = REPO / "configs" / "costs.yaml"
MULTIRUN_FLAGS = ("-m", "--multirun")


class PlanError(RuntimeError):
    pass


@dataclass
class Entry:
    script: Path
    config_dir: Path
    config_name: str
    version_base: str | None


@dataclass
class Cell:
    overrides: list[str]  # the job's sweep overrides, as Hydra passes them
    choices: dict[str, Any]  # hydra.runtime.choices: the config group options composed
    config: Any  # the job's config (DictConfig), hydra node included
    gpu_hours: float | None = None
    gpu: str | None = None
    cpu_minutes: float = 0.0  # the embedded defaults: CPU time instead of GPU-hours
    note: str = ""


# ------------------------------------------------------------------------ entry point


def load_entry(script: str | Path) -> Entry:
    """Import an entry point with `hydra.main` replaced by a recorder of its arguments; the
    import registers the entry point's structured configs (ConfigStore) as a real run does."""
    import hydra

    script = Path(script)
    if not script.is_absolute() and not script.is_file():
        script = REPO / script
    if not script.is_file():
        raise PlanError(f"no such entry point: {script}")
    recorded: dict[str, Any] = {}

    def recorder(config_path: str | None = None, config_name: str | None = None, version_base: str | None = None, **_: Any):
        recorded.update(config_path=config_path, config_name=config_name, version_base=version_base)
        return lambda function: function

    sys.path.insert(0, str(script.resolve().parent))
    spec = importlib.util.spec_from_file_location(f"_plan_entry_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    original, hydra.main = hydra.main, recorder
    try:
        spec.loader.exec_module(module)
    finally:
        hydra.main = original
    if not recorded.get("config_name"):
        raise PlanError(f"{script} has no @hydra.main(config_path=..., config_name=...)")
    config_dir = Path(recorded["config_path"] or ".")
    if not config_dir.is_absolute():
        config_dir = script.resolve().parent / config_dir
    return Entry(script, config_dir.resolve(), recorded["config_name"], recorded["version_base"])


@contextlib.contextmanager
def _hydra(entry: Entry) -> Iterator[Any]:
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(entry.config_dir), version_base=entry.version_base, job_name="plan"):
        yield GlobalHydra.instance().hydra


def expand(entry: Entry, overrides: Sequence[str]) -> tuple[Any, list[Cell]]:
    """(the multirun config, its cells), as Hydra's BasicSweeper would launch them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    with _hydra(entry) as hydra_app:
        config = hydra_app.compose_config(
            config_name=entry.config_name, overrides=list(overrides), run_mode=RunMode.MULTIRUN,
            from_shell=True, with_log_configuration=False,
        )  # fmt: skip
        sweeper = config.hydra.sweeper
        if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
            raise PlanError(f"plan.py expands Hydra's basic sweeper only; this multirun uses {sweeper._target_}")
        params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
        arguments = params + list(OmegaConf.to_container(config.hydra.overrides.task))
        parsed = OverridesParser.create(config_loader=hydra_app.config_loader).parse_overrides(arguments)
        jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
        cells = []
        for job in jobs:
            job_config = hydra_app.config_loader.load_sweep_config(config, list(job))
            choices = OmegaConf.to_container(job_config.hydra.runtime.choices)
            cells.append(Cell(list(job), choices, job_config))
    return config, cells


# ------------------------------------------------------------------------------ costs


def load_costs(path: Path = COSTS) -> dict[str, Any]:
    if not path.is_file():
        raise PlanError(f"no cost table at {path}")
    return yaml.safe_load(path.read_text())


def _select(config: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, key, default=None, throw_on_missing=False)


def estimate(cell: Cell, costs: dict[str, Any], config_name: str) -> None:
    """Fill cell.gpu_hours/gpu/note from the cost table: the experiment preset's entry (the
    embedded default's where no experiment is chosen), scaled by the training length."""
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
    cell.gpu_hours, cell.gpu = float(entry["gpu_hours"]) * scale, entry["gpu"]
    cell.cpu_minutes = float(entry.get("cpu_minutes", 0.0)) * scale
    cell.note = "; ".join(notes)


# ---------------------------------------------------------------------------- printing


def _hours(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def launcher_lines(config: Any, cells: list[Cell]) -> list[str]:
    launcher = config.hydra.launcher
    choice = (cells[0].choices if cells else {}).get("hydra/launcher") or "basic"
    target = str(launcher.get("_target_", "?"))
    lines = [f"launcher: {choice} ({target})"]
    if "SlurmLauncher" in target:
        nodes, gpus = launcher.get("nodes", 1), launcher.get("gpus_per_node") or 0
        timeout_h = launcher.get("timeout_min", 0) / 60
        lines.append(f"  one SLURM job array of {len(cells)} jobs (at most {launcher.get('array_parallelism')} at once); "
                     f"each job {nodes} node(s) x {gpus} GPU(s), {launcher.get('tasks_per_node')} task(s) per node, "
                     f"time limit {timeout_h:g} h, requeued up to {launcher.get('max_num_timeout')} times on time-out; "
                     f"partition {launcher.get('partition')}, account {launcher.get('account')} "
                     "(set with hydra.launcher.partition=... hydra.launcher.account=...)")  # fmt: skip
        per_job = nodes * gpus
        longest = max((c.gpu_hours for c in cells if c.gpu_hours is not None), default=None)
        if per_job and longest:
            wall = longest / per_job
            lines.append(f"  longest job: ~{_hours(wall)} h of wall-clock on {per_job} GPU(s) of the cost table's kind"
                         + (f" = {math.ceil(wall / timeout_h)} time slots of {timeout_h:g} h (checkpoint and requeue)"
                            if timeout_h and wall > timeout_h else ""))  # fmt: skip
    elif "LocalLauncher" in target:
        lines.append(f"  submitit's local executor: {len(cells)} subprocesses on this machine")
    else:
        lines.append(f"  Hydra's basic launcher: the {len(cells)} cells one after another in this process")
    lines.append("  the launching command blocks until every job has ended (Hydra collects each job's result): "
                 "run it inside tmux/screen or with nohup, and keep that shell alive for the whole sweep")  # fmt: skip
    return lines


def render(entry: Entry, config: Any, cells: list[Cell], command: Sequence[str]) -> str:
    from omegaconf import OmegaConf

    params = OmegaConf.to_container(config.hydra.sweeper.get("params") or {})
    varying = [k for k in dict.fromkeys(o.split("=", 1)[0] for c in cells for o in c.overrides)
               if len({o for c in cells for o in c.overrides if o.split("=", 1)[0] == k}) > 1]  # fmt: skip
    fixed = [o for o in (cells[0].overrides if cells else []) if o.split("=", 1)[0] not in varying]
    lines = [
        "plan: python " + " ".join([str(entry.script.relative_to(REPO)) if entry.script.is_relative_to(REPO) else str(entry.script), "-m", *command]),
        "sweep params (hydra.sweeper.params): " + (", ".join(f"{k}: {v}" for k, v in params.items()) or "none"),
        "the same in every cell: " + (" ".join(fixed) or "nothing"),
        "",
        f"{len(cells)} cells:",
    ]
    rows = [("#", "cell overrides", "experiment", "est. GPU-h")]
    for i, cell in enumerate(cells):
        mine = " ".join(o for o in cell.overrides if o.split("=", 1)[0] in varying) or "(none)"
        if cell.gpu_hours is None:
            cost = "?"
        elif cell.gpu == "CPU":
            cost = f"0 (CPU, ~{cell.cpu_minutes:g} min)"
        else:
            cost = f"{_hours(cell.gpu_hours)} {cell.gpu}"
        rows.append((str(i), mine, str(cell.choices.get("experiment") or "(embedded default)"), cost + (f"  [{cell.note}]" if cell.note else "")))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines += ["  " + "  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    lines.append("")
    by_gpu: dict[str, float] = {}
    for cell in cells:
        if cell.gpu_hours is not None and cell.gpu != "CPU":
            by_gpu[cell.gpu] = by_gpu.get(cell.gpu, 0.0) + cell.gpu_hours
    unknown = sum(c.gpu_hours is None for c in cells)
    cpu = [c for c in cells if c.gpu == "CPU"]
    total = " + ".join(f"{_hours(h)} {gpu}-hours" for gpu, h in by_gpu.items()) or "0 GPU-hours"
    if cpu:
        total += f" (and {len(cpu)} CPU runs, ~{sum(c.cpu_minutes for c in cpu):g} CPU-minutes)"
    lines.append(f"total: {len(cells)} runs, {total} (estimate from configs/costs.yaml)"
                 + (f"; {unknown} cells without a cost entry not counted" if unknown else ""))  # fmt: skip
    lines += launcher_lines(config, cells)
    lines.append("nothing was submitted; to launch, run the command above without scripts/plan.py")
    return "\n".join(lines)


def plan(script: str | Path, overrides: Sequence[str], *, costs: Path = COSTS) -> tuple[Entry, Any, list[Cell]]:
    entry = load_entry(script)
    config, cells = expand(entry, overrides)
    table = load_costs(costs)
    for cell in cells:
        estimate(cell, table, entry.config_name)
    return entry, config, cells


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--costs", default=str(COSTS), help="cost table (default %(default)s)")
    parser.add_argument("script", help="the entry point: train_vit.py or train_gpt2.py")
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="the multirun's arguments (Hydra overrides; -m optional)")
    args = parser.parse_args(argv)
    overrides = [o for o in args.overrides if o not in MULTIRUN_FLAGS]
    flags = [o for o in overrides if o.startswith("-")]
    if flags:
        sys.exit(f"error: plan.py takes Hydra overrides only (and -m), not {' '.join(flags)}")
    try:
        entry, config, cells = plan(args.script, overrides, costs=Path(args.costs))
    except PlanError as error:
        sys.exit(f"error: {error}")
    print(render(entry, config, cells, overrides))


if __name__ == "__main__":
    main()
