"""Settings a GPU run needs that a CPU process can check: DataLoader workers from the task's CPUs,
each process's RNG states through a checkpoint (2 gloo processes), and FSDP2 in bf16 with fp32
gradient reduction (2 gloo processes, one update)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from horst_sparse.training.resolvers import loader_workers


def test_loader_workers_are_the_tasks_cpus_shared_by_its_processes(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "32")
    assert loader_workers() == 31
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's 4 processes in one task of 32 CPUs
    assert loader_workers() == 7
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert loader_workers() == max(1, len(os.sched_getaffinity(0)) - 1)
    cfg = OmegaConf.create({"workers": "${loader_workers:}"})
    assert cfg.workers == loader_workers()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)


def _resume_rng(rank: int, port: int, folder: str, results) -> None:
    from horst_sparse.training.checkpoint import gather_rng_states, load_checkpoint, restore_rng_state, save_checkpoint

    _group(rank, port)
    torch.manual_seed(100 + rank)  # each process its own stream (drop path, dropout)
    torch.rand(3)
    ranks = gather_rng_states()  # what Run.save adds to a checkpoint under DDP
    if rank == 0:
        save_checkpoint({"rng": ranks[0], "rng_ranks": ranks}, os.path.join(folder, "ckpt.pt"))
    dist.barrier()
    expected = torch.rand(4)
    torch.manual_seed(0)  # a requeued process starts afresh
    saved = load_checkpoint(os.path.join(folder, "ckpt.pt"))["rng_ranks"]
    restore_rng_state(saved[rank])  # what Run.restore does with it
    results[rank] = (expected, torch.rand(4))
    dist.destroy_process_group()


def test_each_process_resumes_its_own_rng_states(tmp_path):
    results = mp.Manager().dict()
    mp.spawn(_resume_rng, args=(_free_port(), str(tmp_path), results), nprocs=2)
    (expected0, resumed0), (expected1, resumed1) = results[0], results[1]
    assert torch.equal(expected0, resumed0) and torch.equal(expected1, resumed1)
    assert not torch.equal(expected0, expected1)


def _fsdp2_bf16(rank: int, port: int, results) -> None:
    from horst_sparse.gpt2.model import build_model, lm_loss
    from horst_sparse.training.distributed import DistInfo, parallelize

    _group(rank, port)
    torch.manual_seed(0)
    nano = OmegaConf.create(
        dict(name="n", n_layer=2, n_head=2, n_embd=16, n_positions=16, dropout=0.0, tie_word_embeddings=True)
    )
    model = build_model(nano, vocab_size=64)
    seen = []
    block = model.transformer.h[0].attn.c_attn
    block.register_forward_pre_hook(lambda module, args: seen.append((module.weight.dtype, args[0].dtype)))
    train_model = parallelize(
        model,
        "fsdp2",
        info=DistInfo(rank, 2),
        device=torch.device("cpu"),
        blocks=model.transformer.h,
        dtype=torch.bfloat16,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(64, (2, 17))
    loss = lm_loss(train_model(tokens[:, :-1]).logits, tokens[:, 1:], vocab_size=64)
    loss.backward()
    grads = {p.grad.dtype for p in model.parameters()}
    optimizer.step()
    results[rank] = (seen, {p.dtype for p in model.parameters()}, grads, torch.isfinite(loss).item())
    dist.destroy_process_group()


def test_fsdp2_computes_in_bf16_and_keeps_fp32_weights_and_gradients():
    results = mp.Manager().dict()
    mp.spawn(_fsdp2_bf16, args=(_free_port(), results), nprocs=2)
    for rank in (0, 1):
        seen, weights, grads, finite = results[rank]
        assert seen == [(torch.bfloat16, torch.bfloat16)]  # the all-gathered weights and the activations
        assert weights == {torch.float32} and grads == {torch.float32} and finite


@pytest.mark.slow  # torch.compile of the model, its backward and the loss: ~30 s on 2 cores
def test_the_compiled_gpt2_step_gives_the_eager_steps_losses():
    """`compile: true` (the GPU recipe's) on the pipeline's own step: the compiled model and the
    compiled loss (`lm_loss_fn`) against eager ones, from the same weights over the same batches."""
    import copy

    from horst_sparse.gpt2.model import build_model, lm_loss_fn
    from horst_sparse.gpt2.run import train_step
    from horst_sparse.training.distributed import DistInfo, parallelize
    from horst_sparse.training.schedule import build_lr_scheduler

    torch.manual_seed(0)
    nano = OmegaConf.create(
        dict(name="n", n_layer=2, n_head=2, n_embd=32, n_positions=32, dropout=0.0, tie_word_embeddings=True)
    )
    eager = build_model(nano, vocab_size=128)
    batches = [[(x[:, :-1], x[:, 1:]) for x in torch.randint(128, (2, 4, 33))] for _ in range(3)]
    losses = {}
    for compile in (False, True):
        model = copy.deepcopy(eager)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = build_lr_scheduler(optimizer, total_steps=3, warmup_steps=1, min_lr=1e-4, warmup_lr=0.0)
        train_model = parallelize(model, "ddp", info=DistInfo(), device=torch.device("cpu"), compile=compile)
        loss_fn = lm_loss_fn(128, compile=compile)
        losses[compile] = [
            train_step(
                train_model,
                model,
                optimizer,
                scheduler,
                micro_batches,
                step=step,
                accum=2,
                loss_fn=loss_fn,
                dtype=torch.float32,
                grad_clip=1.0,
                watch_loss=lambda loss, step: None,
            )[0].item()
            for step, micro_batches in enumerate(batches)
        ]
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
    assert losses[False][0] != losses[False][-1]  # the steps changed the weights
