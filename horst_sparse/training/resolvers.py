"""The OmegaConf resolvers the configs may use, registered once for every entry point, test and
SLURM job (horst_sparse/training/config.py imports this module). Each lets a control derive a value from the
arm it controls instead of copying it.

* `sum`: the sum of its arguments, e.g. `${sum:${tuned.horst.weight_decay},${tuned.horst.beta}}`.
* `decay_matched`: the weight decay that gives AdamW, at its own tuned learning rate, as much
  shrinkage per step as the arm named (configs/experiment/adamw_decay.yaml: `${decay_matched:horst}`).
  HORST shrinks a mirrored weight by (1 - lr_h wd_h) exp(-lr_h beta_h) ~ 1 - lr_h (wd_h + beta_h)
  per step, AdamW by 1 - lr_a wd; equal when wd = (wd_h + beta_h) lr_h / lr_a. Both follow the
  same schedule's shape, so the match holds at every step but the warm-up's.
* `loader_workers`: DataLoader workers per training process from the CPUs its task has
  (`task_cpus`), shared by the processes torchrun starts on the node, one CPU kept for each
  process itself (configs/vit_recipe/deit_imagenet.yaml).
"""

from __future__ import annotations

import os

from omegaconf import OmegaConf

LR_KEYS = ("lr", "base_lr")  # a tuned file's learning rate: GPT-2's train.lr, the ViT's train.base_lr


def decay_matched(arm: str, *, _root_) -> float:
    controlled, adamw = _root_.tuned[arm], _root_.tuned.adamw
    key = next(k for k in LR_KEYS if k in adamw)
    return float((controlled.weight_decay + controlled.beta) * controlled[key] / adamw[key])


def task_cpus() -> int:
    """The CPUs of this task: SLURM's `--cpus-per-task` where SLURM set it, else the CPUs this
    process may run on (its affinity: a container's or cgroup's share, not the node's count)."""
    return int(os.environ.get("SLURM_CPUS_PER_TASK") or len(os.sched_getaffinity(0)))


def loader_workers() -> int:
    """Each process's share of `task_cpus` (torchrun's LOCAL_WORLD_SIZE processes on one task),
    less the one that runs the process itself; at least 1."""
    return max(1, task_cpus() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")) - 1)


RESOLVERS = {"sum": lambda *values: sum(values), "decay_matched": decay_matched, "loader_workers": loader_workers}

for _name, _resolver in RESOLVERS.items():
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, _resolver)
