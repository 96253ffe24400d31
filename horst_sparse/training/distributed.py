"""Distributed training: the process group from `torchrun` or SLURM environment variables, and
the two ways a pipeline spreads its model over the processes (`parallelize`).

* `ddp`: every process holds the whole model; `DistributedDataParallel` averages gradients.
* `fsdp2`: `torch.distributed.fsdp.fully_shard` on each transformer block and on the root:
  parameters, gradients and optimizer state become DTensors of which each process holds one
  shard; the forward pass all-gathers a block's weights, the backward reduce-scatters its
  gradients. Same arithmetic as DDP (the all-gathered weights are bitwise the whole ones), so
  a run equals DDP's up to the rounding of the gradient-norm clip. Checkpoints go through
  `torch.distributed.checkpoint` (`horst_sparse.training.checkpoint`); evaluation and pruning gather the
  whole weights into a plain copy (`unsharded`).

Launchers understood, in this order:
* `torchrun` (or anything that exports RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR);
* a SLURM job step of several tasks (`srun`, or submitit's SLURM executor): SLURM_PROCID,
  SLURM_STEP_NUM_TASKS, SLURM_LOCALID, and the first host of SLURM_JOB_NODELIST as the
  rendezvous address. Only srun sets SLURM_STEP_NUM_TASKS: a plain `python train_*.py` in an
  sbatch script has SLURM_PROCID=0 and the allocation's SLURM_NTASKS too, but no other process
  will join it, so it runs alone (and says so) instead of waiting for them;
* submitit's local executor with several tasks.
With none of them, or a single task, the run is a plain single process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import random
import sys
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.distributed as dist

from horst_sparse.training.config import RunError
from horst_sparse.training.env import cuda_device, cuda_problem

STRATEGIES = ("ddp", "fsdp2")
# How long a collective waits for every rank before the run fails. Longer than torch's default
# (10 minutes for NCCL): the other ranks wait in a barrier while rank 0 lists ImageNet's 1.28M
# files once (minutes on a network file system); a rank that dies still ends the job at once.
PROCESS_GROUP_TIMEOUT = datetime.timedelta(minutes=30)


@dataclasses.dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def _export_from_job_environment(job) -> None:
    """Export torch's env:// variables from a submitit job environment (SLURM or local)."""
    os.environ.setdefault("MASTER_ADDR", job.hostnames[0])
    # Same port for every task of the job, different across jobs sharing a node.
    os.environ.setdefault("MASTER_PORT", str(random.Random(job.job_id).randint(20000, 60000)))
    os.environ["RANK"] = str(job.global_rank)
    os.environ["WORLD_SIZE"] = str(job.num_tasks)
    os.environ["LOCAL_RANK"] = str(job.local_rank)


def _discover_launcher() -> None:
    if "WORLD_SIZE" in os.environ:  # torchrun, or exported by hand
        return
    # srun exports SLURM_STEP_NUM_TASKS to its step's tasks; a batch script's own process has only SLURM_NTASKS
    if "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
        from submitit.slurm.slurm import SlurmJobEnvironment

        _export_from_job_environment(SlurmJobEnvironment())
    elif "SLURM_STEP_NUM_TASKS" not in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        print(
            f"note: this SLURM allocation has {os.environ['SLURM_NTASKS']} tasks, but this process was not "
            "started by srun: it trains alone; `srun python ...` in the sbatch script starts one process per task",
            file=sys.stderr,
        )
    elif os.environ.get("SUBMITIT_EXECUTOR") == "local":
        from submitit.local.local import LocalJobEnvironment

        job = LocalJobEnvironment()
        if job.num_tasks > 1:
            _export_from_job_environment(job)


def init_distributed(device_type: str) -> DistInfo:
    """Start the process group when launched with several processes (gloo on CPU, nccl on CUDA)."""
    _discover_launcher()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        if device_type == "cuda" and (problem := cuda_problem()):  # before NCCL fails in its own words
            raise RunError(f"device=cuda, but {problem}")
        backend = "nccl" if device_type == "cuda" else "gloo"
        device_id = cuda_device(info.local_rank) if device_type == "cuda" else None
        dist.init_process_group(
            backend=backend, rank=info.rank, world_size=world_size, device_id=device_id, timeout=PROCESS_GROUP_TIMEOUT
        )
    return info


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast_object(obj):
    """Rank 0's `obj` on every process (picklable; identity in a single process)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj) -> list:
    """Every process's `obj`, by rank, on every process (picklable; `[obj]` in a single process)."""
    if not dist.is_initialized():
        return [obj]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over processes (in place, also returned); identity in a single process."""
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Mean over processes (in place, also returned); identity in a single process."""
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= dist.get_world_size()
    return tensor


def parallelize(
    model: torch.nn.Module,
    strategy: str,
    *,
    info: DistInfo,
    device: torch.device,
    compile: bool = False,
    blocks: Iterable[torch.nn.Module] = (),
    dtype: torch.dtype = torch.float32,
) -> torch.nn.Module:
    """The module the training loop calls, `model` spread over the processes as `strategy` says.

    `ddp`: `model` (compiled if `compile`), in `DistributedDataParallel` when there are several
    processes; `model` itself keeps the whole weights. `fsdp2`: `fully_shard` on each of
    `blocks`, then on `model`, in place: its parameters become DTensor shards, so build the
    optimizer after this call; a run in `dtype` bf16 (its autocast dtype) all-gathers the weights
    and computes in bf16 and reduce-scatters the gradients in fp32 (`MixedPrecisionPolicy`), the
    sharded weights and the optimizer staying fp32."""
    if strategy == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (info.world_size,))
        policy = MixedPrecisionPolicy() if dtype == torch.float32 else MixedPrecisionPolicy(dtype, torch.float32)
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        return fully_shard(model, mesh=mesh, mp_policy=policy)
    train_model = torch.compile(model) if compile else model
    if info.enabled:
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(train_model, device_ids=[device.index] if device.type == "cuda" else None)
    return train_model


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether `model`'s parameters are DTensor shards (FSDP2)."""
    tensor = sys.modules.get("torch.distributed.tensor")  # not imported: no DTensor exists (its import takes seconds)
    return tensor is not None and any(isinstance(p, tensor.DTensor) for p in model.parameters())


@contextlib.contextmanager
def gradient_sync(train_model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Reduce the gradients over the processes in this backward pass, or (`enabled=False`, a
    gradient-accumulation micro-batch but the last) only accumulate them locally: DDP's
    `no_sync`, FSDP2's `set_requires_gradient_sync`. Nothing to do in a single process."""
    if enabled or not dist.is_initialized():
        yield
    elif hasattr(train_model, "set_requires_gradient_sync"):  # FSDP2
        train_model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            train_model.set_requires_gradient_sync(True)
    else:
        with train_model.no_sync():
            yield


def unsharded(model: torch.nn.Module, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """`model` with its whole weights on every process, for evaluation and pruning: `model`
    itself unless FSDP2 shards it; then a plain `build()` holding the all-gathered weights
    (a collective: every process calls it). Building draws no random numbers from the run's
    generators."""
    if not is_sharded(model):
        return model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    device = next(iter(weights.values())).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        whole = build()
    whole.load_state_dict(weights)
    return whole
