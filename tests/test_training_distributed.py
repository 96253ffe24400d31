"""training.distributed: launcher discovery from torchrun / SLURM variables (no process group)."""

from __future__ import annotations

import os

import pytest

from training import distributed
from training.distributed import DistInfo, init_distributed

LAUNCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SUBMITIT_EXECUTOR")


@pytest.fixture(autouse=True)
def clean_env():
    """No launcher variables in, none out: `_discover_launcher` exports RANK/WORLD_SIZE/...,
    which would make every later in-process run wait for a process group."""
    saved = dict(os.environ)
    for key in LAUNCH_VARS:
        os.environ.pop(key, None)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_single_process_without_launcher():
    assert init_distributed("cpu") == DistInfo(rank=0, world_size=1, local_rank=0)


def test_slurm_variables_become_torch_env(monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[07-08]")
    distributed._discover_launcher()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("3", "4", "1")
    assert os.environ["MASTER_ADDR"] == "gpu07"
    assert 20000 <= int(os.environ["MASTER_PORT"]) <= 60000


def test_single_slurm_task_is_not_distributed(monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert init_distributed("cpu").world_size == 1
