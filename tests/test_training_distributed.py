"""horst_sparse.training.distributed: launcher discovery from torchrun / SLURM variables, and what
`parallelize` and its helpers do in a single process (no process group; the 2-process
ddp/fsdp2 runs are in test_gpt2_fsdp.py and test_training_checkpoint.py), and the timeout of a
real 2-process group."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from horst_sparse.training import distributed
from horst_sparse.training.distributed import (
    DistInfo,
    gradient_sync,
    init_distributed,
    is_sharded,
    parallelize,
    unsharded,
)

LAUNCH_VARS = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "SUBMITIT_EXECUTOR",
)


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
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")  # srun's
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


def test_plain_python_in_a_multi_task_sbatch_script_trains_alone_instead_of_waiting(monkeypatch, capsys):
    """An sbatch --ntasks=4 script's own process: SLURM_PROCID=0 and the allocation's SLURM_NTASKS,
    but no srun step (no SLURM_STEP_NUM_TASKS); no other process will join its process group."""
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu07")
    assert init_distributed("cpu") == DistInfo()
    assert "WORLD_SIZE" not in os.environ
    (note,) = capsys.readouterr().err.strip().splitlines()
    assert "4 tasks" in note and "not started by srun" in note and "srun python" in note


@pytest.fixture
def two_cuda_ranks(monkeypatch):
    """torchrun's variables of local rank 3 of a 2-process job on CUDA (mocked: no GPU here)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "3")
    started = {}
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kwargs: started.update(kwargs))
    return started


def test_a_rank_bound_to_one_gpu_starts_nccl_on_the_gpu_it_sees(monkeypatch, two_cuda_ranks):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # SLURM's --gpus-per-task=1
    assert init_distributed("cuda") == DistInfo(rank=1, world_size=2, local_rank=3)
    assert two_cuda_ranks["backend"] == "nccl" and two_cuda_ranks["device_id"] == torch.device("cuda", 0)
    assert two_cuda_ranks["timeout"] == distributed.PROCESS_GROUP_TIMEOUT


def test_ranks_on_cuda_without_cuda_stop_in_one_line_before_nccl(monkeypatch, two_cuda_ranks):
    import torch

    from horst_sparse.training.config import RunError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RunError, match="^device=cuda, but "):
        init_distributed("cuda")
    assert not two_cuda_ranks


def test_one_process_trains_the_model_itself_and_accumulates_gradients():
    import torch

    model = torch.nn.Linear(3, 2)
    train_model = parallelize(model, "ddp", info=DistInfo(), device=torch.device("cpu"))
    assert train_model is model and not is_sharded(model)
    assert unsharded(model, build=lambda: pytest.fail("a whole model is not rebuilt")) is model
    x = torch.ones(1, 3)
    for last in (False, True):
        with gradient_sync(train_model, last):
            train_model(x).sum().backward()
    assert torch.equal(model.weight.grad, torch.full((2, 3), 2.0))


def _start_and_report_the_timeout(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK="0")
    import torch

    init_distributed("cpu")
    try:
        backend = distributed.dist.group.WORLD._get_backend(torch.device("cpu"))
        Path(out, str(rank)).write_text(str(backend.options._timeout.total_seconds()))
        distributed.barrier()
    finally:
        distributed.shutdown_distributed()


def test_the_process_group_waits_the_stated_timeout_for_every_rank(tmp_path):
    """Two real processes start their gloo group as a run does: its collectives wait
    PROCESS_GROUP_TIMEOUT, not torch's default (NCCL's 10 minutes would end a run whose rank 0
    lists ImageNet on a network file system while the others wait)."""
    import torch.multiprocessing

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    torch.multiprocessing.spawn(_start_and_report_the_timeout, args=(port, str(tmp_path)), nprocs=2)
    stated = distributed.PROCESS_GROUP_TIMEOUT.total_seconds()
    assert stated >= 30 * 60
    assert [float((tmp_path / str(rank)).read_text()) for rank in range(2)] == [stated, stated]
