"""Each CUDA path a GPU run takes, run on the GPU (make gpu-check; skipped, and so failing that
check, without CUDA): a GPT-2 run resumed on HORST's fast path bit for bit, the pipeline's step
under DDP over NCCL and under FSDP2 in bf16, and both entry points end to end on `device: cuda`
with `compile=true`. The compiled HORST step against the plain one is tests/test_horst_gpu.py's;
the step's MFU against its target is bench/train_step.py's (Makefile: GPU_MFU_TARGET)."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT, _subprocess_env, compose_cfg, final_params, tiny_overrides
from omegaconf import OmegaConf

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check on a GPU machine)"),
]
CUDA = ["device=cuda", "cpu_threads=null", "reproducible_cpu=false"]


def test_a_gpt2_run_resumed_on_the_fast_path_is_the_uninterrupted_one_bit_for_bit(pydoc_dir, tmp_path):
    from horst_sparse.gpt2.run import run

    overrides = tiny_overrides(
        pydoc_dir, *CUDA, "optimizer=horst", "engine=fast", "train.max_steps=8", "train.keep_checkpoints=4"
    )
    run(compose_cfg(overrides), run_dir=tmp_path / "whole")
    checkpoint = tmp_path / "whole" / "ckpt_00000004.pt"
    run(compose_cfg([*overrides, f"resume={checkpoint}"]), run_dir=tmp_path / "resumed")
    expected, actual = final_params(tmp_path / "whole"), final_params(tmp_path / "resumed")
    assert all(torch.equal(expected[name], actual[name]) for name in expected)
    summary = lambda d: json.loads((tmp_path / d / "summary.json").read_text())  # noqa: E731
    assert summary("resumed")["ppl"] == summary("whole")["ppl"]


def _nano():
    from horst_sparse.gpt2.model import VOCAB_MULTIPLE, build_model

    torch.manual_seed(0)
    nano = OmegaConf.create(
        dict(name="n", n_layer=2, n_head=2, n_embd=64, n_positions=64, dropout=0.0, tie_word_embeddings=True)
    )
    return build_model(nano, vocab_size=1000, vocab_multiple=VOCAB_MULTIPLE).cuda()


def _steps(train_model, model, steps: int = 3) -> list[float]:
    """The pipeline's own step, `steps` times, on fixed batches; the losses."""
    from horst_sparse.gpt2.model import lm_loss_fn
    from horst_sparse.gpt2.run import train_step
    from horst_sparse.training.schedule import build_lr_scheduler

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scheduler = build_lr_scheduler(optimizer, total_steps=steps, warmup_steps=1, min_lr=1e-4, warmup_lr=0.0)
    generator = torch.Generator(device="cuda").manual_seed(1)
    batches = [torch.randint(1000, (2, 4, 65), device="cuda", generator=generator) for _ in range(steps)]
    return [
        train_step(
            train_model,
            model,
            optimizer,
            scheduler,
            [(x[:, :-1], x[:, 1:]) for x in windows],
            step=step,
            accum=2,
            loss_fn=lm_loss_fn(1000),
            dtype=torch.bfloat16,
            grad_clip=1.0,
            watch_loss=lambda loss, step: None,
        )[0].item()
        for step, windows in enumerate(batches)
    ]


@pytest.fixture
def nccl_group():
    """A one-process NCCL group on GPU 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    yield
    dist.destroy_process_group()


def test_ddp_over_nccl_steps_as_one_process(nccl_group):
    from torch.nn.parallel import DistributedDataParallel

    plain = _nano()
    model = copy.deepcopy(plain)
    ddp = DistributedDataParallel(model, device_ids=[0])
    assert _steps(ddp, model) == _steps(plain, plain)  # one process: the all-reduce divides by 1
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), plain.parameters()))


def test_fsdp2_on_cuda_in_bf16_steps_as_one_process(nccl_group):
    from horst_sparse.training.distributed import DistInfo, parallelize

    plain = _nano()
    model = copy.deepcopy(plain)
    sharded = parallelize(
        model,
        "fsdp2",
        info=DistInfo(0, 1),
        device=torch.device("cuda"),
        blocks=model.transformer.h,
        dtype=torch.bfloat16,
    )
    # bf16 weights in the forward (not autocast's per-op casts): the same losses up to bf16 rounding
    assert _steps(sharded, model) == pytest.approx(_steps(plain, plain), rel=2e-2)


def _train(script: str, tmp_path, *overrides: str) -> dict:
    run_dir = tmp_path / script
    command = [sys.executable, str(ROOT / script), *overrides, *CUDA, "compile=true", f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, env=_subprocess_env(), capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


def test_train_gpt2_end_to_end_on_cuda_compiled(tmp_path):
    summary = _train("train_gpt2.py", tmp_path, "experiment=smoke_gpt2")
    assert summary["train"]["device"] == "cuda:0" and summary["train"]["steps"] == 20  # smoke's default budget
    assert all(p["ppl"] > 1 for p in summary["pruning"]["results"])
    assert summary["fast_path_fallbacks"] == []


def test_train_vit_end_to_end_on_cuda_compiled(tmp_path):
    summary = _train("train_vit.py", tmp_path, "experiment=smoke_vit")
    assert summary["train"]["device"] == "cuda:0" and summary["train"]["precision"] == "bfloat16"
    assert 0 <= summary["top1"] <= 1 and summary["fast_path_fallbacks"] == []
