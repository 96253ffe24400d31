"""horst under the wrappers users put around an optimizer once a model outgrows one process:
FSDP2 (``fully_shard``: DTensor parameters) on the fast and the plain path,
``ZeroRedundancyOptimizer``, DDP, and a ``torch.distributed.checkpoint`` round trip of
``get_optimizer_state_dict`` / ``set_optimizer_state_dict``, each with 2 gloo processes on CPU
against a single-process run of the same steps, for all four optimizers.

Every rank trains on the same batch, so the averaged gradient is the single process's bit for
bit and any difference comes from the optimizer: the plain path must match exactly, the fast
path (the C kernel, whose vector and scalar loops split a shard differently) to 1e-6. The
model has a layer of 5 rows (shards of 3 and 2) and one of 1 row (rank 1 holds none of it).

Starting a process group costs ~10 s on 2 cores, so one spawned job runs every check and
saves what it saw; the comparisons run in the test process.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import horst
from horst.mirror import exp_float32

WORLD = 2
STEPS, RESUME_AT = 4, 2
OPTIMIZERS = {
    "HORST": (horst.HORST, dict(lr=1e-2, weight_decay=0.1, alpha=20.0, beta=0.5)),
    "HAM": (horst.HAM, dict(lr=2e-3, weight_decay=0.1)),
    "HORSTLion": (horst.HORSTLion, dict(lr=1e-3, weight_decay=0.1, alpha=20.0, beta=0.5)),
    "HORSTSGD": (horst.HORSTSGD, dict(lr=1e-2, momentum=0.9, alpha=5.0, beta=0.5)),
}
PATHS = {"fast": True, "plain": False}
WRAPPERS = ("fsdp2", "zero", "ddp", "dcp")


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    generator = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(8, 6, generator=generator), torch.randn(8, 1, generator=generator)
    for _ in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(inputs), targets).backward()
        optimizer.step()


def make_optimizer(name: str, params, fused: bool) -> torch.optim.Optimizer:
    cls, kwargs = OPTIMIZERS[name]
    return cls(params, fused=fused, **kwargs)


def full_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in model.parameters()]


# ------------------------------------------------------------------------------ the spawned job


def _sharded(seed: int = 0) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = make_model(seed)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def _dcp_round_trip(name: str, fused: bool, folder: str) -> list[torch.Tensor]:
    """RESUME_AT steps, save model and optimizer through DCP, load into a fresh sharded model
    (other initial weights) and optimizer, the remaining steps."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = _sharded()
    optimizer = make_optimizer(name, model.parameters(), fused)
    train(model, optimizer, RESUME_AT)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)
    resumed = _sharded(seed=1)
    resumed_optimizer = make_optimizer(name, resumed.parameters(), fused)
    model_state, optimizer_state = get_state_dict(resumed, resumed_optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(resumed, resumed_optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    train(resumed, resumed_optimizer, STEPS - RESUME_AT)
    return full_weights(resumed)


def _wrapped_run(wrapper: str, name: str, fused: bool, folder: str) -> list[torch.Tensor]:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    if wrapper == "dcp":
        return _dcp_round_trip(name, fused, folder)
    if wrapper == "fsdp2":
        model = _sharded()
        optimizer = make_optimizer(name, model.parameters(), fused)
    else:
        model = DistributedDataParallel(make_model())
        if wrapper == "zero":
            cls, kwargs = OPTIMIZERS[name]
            optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, fused=fused, **kwargs)
        else:
            optimizer = make_optimizer(name, model.parameters(), fused)
    train(model, optimizer, STEPS)
    return full_weights(model)


def _mixed_layout_run(fused: bool) -> list[torch.Tensor]:
    """A sharded parameter whose gradient is replicated: no local shard to step, the plain
    path's operators on the DTensors themselves (and the fast path hands them to it)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (WORLD,))
    weights, grads = mixed_layout_problem()
    params = [torch.nn.Parameter(distribute_tensor(w, mesh, [Shard(0)])) for w in weights]
    optimizer = horst.HORST(params, lr=1e-2, alpha=20.0, beta=0.5, fused=fused)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = distribute_tensor(g, mesh, [Replicate()])
        optimizer.step()
    return [p.full_tensor().detach() for p in params]


def mixed_layout_problem():
    generator = torch.Generator().manual_seed(2)
    weights = [torch.randn(5, 4, generator=generator), torch.randn(3, generator=generator)]
    grads = [[torch.randn(w.shape, generator=generator) for w in weights] for _ in range(3)]
    return weights, grads


def _job(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        results = {}
        x = torch.linspace(-90, 90, 1001)
        sharded = distribute_tensor(x, init_device_mesh("cpu", (WORLD,)), [Shard(0)])
        results["exp_float32"] = exp_float32(sharded).full_tensor()
        for fused in (True, False):
            results[("mixed", fused)] = _mixed_layout_run(fused)
        for wrapper in WRAPPERS:
            for name in OPTIMIZERS:
                for path, fused in PATHS.items():
                    folder = os.path.join(out, f"dcp-{name}-{path}")
                    results[(wrapper, name, path)] = _wrapped_run(wrapper, name, fused, folder)
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def distributed_results(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("distributed")
    mp.spawn(_job, args=(str(folder / "store"), str(folder)), nprocs=WORLD)
    return [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(WORLD)]


@pytest.fixture(scope="module")
def single_process() -> dict:
    results = {}
    for name in OPTIMIZERS:
        for path, fused in PATHS.items():
            model = make_model()
            train(model, make_optimizer(name, model.parameters(), fused), STEPS)
            results[name, path] = full_weights(model)
    return results


# ------------------------------------------------------------------------------ the checks


def assert_matches(actual: list[torch.Tensor], expected: list[torch.Tensor], path: str) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        if path == "plain":
            assert torch.equal(a, e), (a - e).abs().max().item()
        else:
            torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_wrapped_run_matches_single_process(wrapper, name, path, distributed_results, single_process):
    expected = single_process[name, path]
    initial = full_weights(make_model())
    assert any(not torch.equal(e, i) for e, i in zip(expected, initial))  # the steps moved the weights
    for rank_results in distributed_results:
        assert_matches(rank_results[wrapper, name, path], expected, path)


def test_plain_path_on_dtensors_of_different_layouts(distributed_results):
    weights, grads = mixed_layout_problem()
    params = [torch.nn.Parameter(w.clone()) for w in weights]
    optimizer = horst.HORST(params, lr=1e-2, alpha=20.0, beta=0.5, fused=False)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        optimizer.step()
    for fused in (True, False):
        assert_matches(distributed_results[0]["mixed", fused], [p.detach() for p in params], "plain")


def test_exp_float32_on_a_dtensor(distributed_results):
    """The exponential's bit trick on a DTensor: with ``<<`` every factor was a denormal."""
    x = torch.linspace(-90, 90, 1001)
    assert torch.equal(distributed_results[0]["exp_float32"], exp_float32(x))
