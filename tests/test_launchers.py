"""SLURM submission through hydra-submitit-launcher, without a cluster.

A mocked ``submitit.AutoExecutor`` records what would be handed to sbatch: one job array
per multirun, one task per GPU, the time limit and the pre-timeout signal.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hydra.core.utils import JobReturn, JobStatus

ROOT = Path(__file__).resolve().parents[1]


def load_entry_point(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeExecutor:
    """Stands in for submitit.AutoExecutor: records parameters, runs nothing."""

    instances: list["FakeExecutor"] = []

    def __init__(self, *, cluster, folder, **kwargs):
        self.cluster, self.folder, self.init_kwargs = cluster, folder, kwargs
        self.parameters: dict = {}
        self.arrays: list[list] = []
        FakeExecutor.instances.append(self)

    def update_parameters(self, **kwargs):
        self.parameters.update(kwargs)

    def map_array(self, function, *argument_lists):
        jobs = list(zip(*argument_lists))
        self.arrays.append(jobs)
        return [FakeJob(overrides) for overrides, *_ in jobs]


class FakeJob:
    def __init__(self, overrides):
        self.overrides = overrides

    def results(self):
        return [JobReturn(overrides=self.overrides, status=JobStatus.COMPLETED)]


@pytest.fixture
def fake_submitit(monkeypatch):
    import submitit

    FakeExecutor.instances.clear()
    monkeypatch.setattr(submitit, "AutoExecutor", FakeExecutor)
    return FakeExecutor


@pytest.mark.parametrize("entry_point", ["train_gpt2", "train_vit"])
def test_slurm_launcher_submits_one_array_with_one_task_per_gpu(entry_point, fake_submitit, tmp_path, monkeypatch):
    app = load_entry_point(entry_point)
    monkeypatch.setattr(sys, "argv", [
        f"{entry_point}.py", "-m", "hydra/launcher=slurm", "optimizer=adamw,ham,horst",
        "hydra.launcher.gpus_per_node=8", "hydra.launcher.partition=gpu", "hydra.launcher.account=proj",
        f"hydra.sweep.dir={tmp_path}",
    ])  # fmt: skip
    app.main()

    (executor,) = fake_submitit.instances
    assert executor.cluster == "slurm"
    assert executor.init_kwargs == {"slurm_max_num_timeout": 20}
    assert len(executor.arrays) == 1 and len(executor.arrays[0]) == 3  # one array, three jobs
    overrides = sorted(" ".join(job[0]) for job in executor.arrays[0])
    assert [o.split("optimizer=")[1].split()[0] for o in overrides] == ["adamw", "ham", "horst"]
    p = executor.parameters
    assert p["gpus_per_node"] == 8 and p["tasks_per_node"] == 8  # one DDP process per GPU
    assert p["nodes"] == 1 and p["cpus_per_task"] == 8 and p["mem_gb"] == 256
    assert p["timeout_min"] == 2880
    assert p["slurm_partition"] == "gpu" and p["slurm_account"] == "proj"
    assert p["slurm_signal_delay_s"] == 300  # SIGUSR2 5 min before the limit: checkpoint + requeue
    assert p["slurm_array_parallelism"] == 64


def test_slurm_1gpu_preset(fake_submitit, tmp_path, monkeypatch):
    app = load_entry_point("train_gpt2")
    monkeypatch.setattr(sys, "argv", [
        "train_gpt2.py", "-m", "hydra/launcher=slurm_1gpu", "optimizer=horst", f"hydra.sweep.dir={tmp_path}",
    ])  # fmt: skip
    app.main()
    p = fake_submitit.instances[0].parameters
    assert p["gpus_per_node"] == 1 and p["tasks_per_node"] == 1 and p["mem_gb"] == 64


@pytest.mark.parametrize("entry_point, sweep, expected_jobs", [
    ("train_vit", "deit_table", 27), ("train_gpt2", "gpt2_table", 3),
    ("train_vit", "horst_alpha_beta", 16), ("train_gpt2", "ham_alpha_beta", 9), ("train_vit", "vit_sparsity", 15),
])  # fmt: skip
def test_sweep_presets_expand_to_one_array(entry_point, sweep, expected_jobs, fake_submitit, tmp_path, monkeypatch):
    app = load_entry_point(entry_point)
    monkeypatch.setattr(sys, "argv", [
        f"{entry_point}.py", "-m", "hydra/launcher=slurm", f"+sweep={sweep}", f"hydra.sweep.dir={tmp_path}",
    ])  # fmt: skip
    app.main()
    (executor,) = fake_submitit.instances
    (jobs,) = executor.arrays
    assert len(jobs) == expected_jobs
    if sweep == "deit_table":
        cells = {tuple(sorted(o for o in job[0] if o.startswith(("experiment=", "optimizer=")))) for job in jobs}
        assert ("experiment=deit_base_acdc_s90", "optimizer=horst") in cells and len(cells) == 27
