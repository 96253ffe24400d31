"""Distributed data parallel set-up from `torchrun` or SLURM environment variables.

Launchers understood, in this order:
* `torchrun` (or anything that exports RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR);
* a SLURM job step (`srun`, or submitit's SLURM executor): SLURM_PROCID, SLURM_NTASKS,
  SLURM_LOCALID, and the first host of SLURM_JOB_NODELIST as the rendezvous address;
* submitit's local executor with several tasks.
With none of them, or a single task, the run is a plain single process.
"""

from __future__ import annotations

import dataclasses
import os
import random

import torch
import torch.distributed as dist


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
    if "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        from submitit.slurm.slurm import SlurmJobEnvironment

        _export_from_job_environment(SlurmJobEnvironment())
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
        backend = "nccl" if device_type == "cuda" else "gloo"
        device_id = torch.device("cuda", info.local_rank) if device_type == "cuda" else None
        dist.init_process_group(backend=backend, rank=info.rank, world_size=world_size, device_id=device_id)
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
