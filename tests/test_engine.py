"""The compute engine (`engine`, horst_sparse/training/engine.py): `reference` is every config's default
(its bits: tests/test_fingerprint.py against results/fingerprint.json); `fast` computes the same
functions with other rounding, feeds the same batches, and trains to the same bits run after run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT

from horst_sparse.cpu_mode import missing_cpu_flags
from horst_sparse.fingerprint import loss_curve, weights_hash
from horst_sparse.training.checkpoint import latest_checkpoint
from horst_sparse.training.engine import OneDNNLinear, use_engine_
from horst_sparse.vit.data import Mnist1DDataset, TrainLoader, eval_loader


@pytest.mark.parametrize("pipeline", ["vit", "gpt2"])
def test_every_config_runs_the_reference_engine_unless_told(compose, pipeline):
    assert compose(pipeline, [])["engine"] == "reference"
    assert compose(pipeline, ["engine=fast"])["engine"] == "fast"


def test_an_unknown_engine_is_one_line_naming_the_choices():
    done = subprocess.run(
        [sys.executable, "train_vit.py", "engine=turbo", "hydra.run.dir=/nonexistent/never"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "engine='turbo' is unknown; use reference or fast" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_reference_engine_leaves_the_model_as_it_is():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU(), torch.nn.Linear(3, 2))
    use_engine_(model, "reference")
    assert {type(m) for m in model} == {torch.nn.Linear, torch.nn.GELU}


@pytest.mark.parametrize("bias", [True, False])
def test_fast_linears_compute_the_same_function_and_gradients_on_the_same_parameters(bias):
    torch.manual_seed(0)
    reference = torch.nn.Linear(32, 96, bias=bias)
    fast = use_engine_(torch.nn.Sequential(torch.nn.Linear(32, 96, bias=bias)), "fast")[0]
    fast.load_state_dict(reference.state_dict())
    assert isinstance(fast, OneDNNLinear) and fast.state_dict().keys() == reference.state_dict().keys()
    x = torch.randn(8, 6, 32, requires_grad=True)
    x_fast = x.detach().clone().requires_grad_()
    grad = torch.randn(8, 6, 96)
    reference(x).backward(grad)
    fast(x_fast).backward(grad)
    torch.testing.assert_close(fast(x_fast), F.linear(x_fast, reference.weight, reference.bias))
    torch.testing.assert_close(x_fast.grad, x.grad)
    for mine, theirs in zip(fast.parameters(), reference.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad)


def test_fast_gpt2_layers_compute_the_same_logits():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4, use_cache=False)
    reference = GPT2LMHeadModel(config).eval()
    fast = use_engine_(GPT2LMHeadModel(config).eval(), "fast")
    fast.load_state_dict(reference.state_dict())
    assert type(fast.transformer.h[0].attn.c_attn).__name__ == "OneDNNConv1D"
    tokens = torch.randint(50, (2, 16))
    torch.testing.assert_close(fast(tokens).logits, reference(tokens).logits, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def mnist1d(tmp_path_factory):
    cache = tmp_path_factory.mktemp("mnist1d")
    return {
        split: Mnist1DDataset(split, num_samples=1000, val_fraction=0.1, test_fraction=0.5, cache=str(cache))
        for split in ("train", "validation")
    }


@pytest.mark.parametrize("start", [0, 3])
def test_in_memory_batches_are_the_data_loaders_bit_for_bit(mnist1d, start):
    made = {
        in_memory: TrainLoader(
            mnist1d["train"],
            batch_size=64,
            seed=7,
            rank=0,
            world_size=1,
            repeated_aug=1,
            num_workers=0,
            pin_memory=False,
            in_memory=in_memory,
        )
        for in_memory in (False, True)
    }
    assert made[True].in_memory and not made[False].in_memory
    for epoch in (0, 1):
        loaded, indexed = (list(made[m].epoch(epoch, start=start)) for m in (False, True))
        assert len(indexed) == len(loaded) == len(made[True]) - start
        for (x, y), (x_fast, y_fast) in zip(loaded, indexed):
            assert torch.equal(x, x_fast) and torch.equal(y, y_fast) and y.dtype == y_fast.dtype
    loaded, indexed = (
        list(
            eval_loader(
                mnist1d["validation"], batch_size=32, rank=0, world_size=1, num_workers=0, pin_memory=False, in_memory=m
            )
        )
        for m in (False, True)
    )
    assert len(loaded) == len(indexed) and all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(loaded, indexed)
    )


# A short MNIST-1D run (4 epochs: one of each AC/DC phase) in a fresh process through the entry point.
SHORT_VIT = [
    "train_vit.py",
    "vit_recipe=mnist1d",
    "optimizer=horst",
    "train.epochs=4",
    "train.warmup_epochs=1",
    "train.log_interval=1",
    *(
        f"acdc.{phase}=1"
        for phase in ("dense_warmup", "compressed", "decompressed", "final_decompressed", "final_compressed")
    ),
    "logging.mode=disabled",
    "resume=never",
]


def short_vit(run_dir, engine: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HORST_CPU_MODE"}
    done = subprocess.run(
        [
            sys.executable,
            *SHORT_VIT,
            f"engine={engine}",
            f"data.root={run_dir.parent / 'mnist1d'}",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "summary": summary,
        "weights": weights_hash(latest_checkpoint(run_dir)),
        "curve": loss_curve(run_dir),
    }


@pytest.mark.skipif(bool(missing_cpu_flags()), reason="the reproducible CPU mode needs AVX2 and FMA")
def test_the_fast_engine_trains_to_the_same_bits_twice_and_rounds_otherwise_than_the_reference(tmp_path):
    first, second = (short_vit(tmp_path / f"fast{i}", "fast") for i in (1, 2))
    reference = short_vit(tmp_path / "reference", "reference")
    assert first["summary"]["environment"]["cpu_mode"]["reproducible"] is True
    assert (first["weights"], first["curve"]) == (second["weights"], second["curve"])
    assert first["curve"] != reference["curve"]  # other kernels: other rounding ...
    assert abs(float.fromhex(first["curve"]["1"]) - float.fromhex(reference["curve"]["1"])) < 1e-5  # ... of one loss
    assert first["summary"]["train"]["steps"] == reference["summary"]["train"]["steps"] == 60
    assert abs(first["summary"]["top1"] - reference["summary"]["top1"]) < 0.1


def test_a_run_recorded_without_an_engine_is_the_same_cell_as_either_engine():
    """Runs of protocols v1-v6 record no `engine`; the engines differ in rounding only, as `compile`
    does, so resume, the tables and the study's stale-run check read them as the same settings."""
    from horst_sparse.training.no_effect import NO_EFFECT, no_effect
    from horst_sparse.training.runner import config_differences

    recorded = {"seed": 10, "optimizer": {"name": "horst"}}
    assert no_effect("engine")
    for engine in ("reference", "fast"):
        assert config_differences(recorded, {**recorded, "engine": engine}, ignore=NO_EFFECT) == []
