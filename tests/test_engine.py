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
from horst_sparse.training.engine import OneDNNLinear, PatchConv2d, use_engine_
from horst_sparse.training.kernels import (
    MAX_DIM,
    MAX_SEQ,
    KernelGELU,
    attention_backward,
    attention_forward,
    fits,
    gelu,
    short_attention,
)
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


def attention64(qkv: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v per head in float64, [batch, seq, heads * dim]: the reference."""
    q, k, v = qkv.double().permute(2, 0, 3, 1, 4).unbind(0)
    out = ((q @ k.transpose(-2, -1)) * scale).softmax(-1) @ v
    return out.transpose(1, 2).flatten(2)


# the ViT's shape (its AVX2 code), other shapes (the plain loops), the largest the kernel takes
ATTENTION_SHAPES = [(64, 6, 4, 8), (3, 5, 2, 12), (2, 1, 3, 4), (2, MAX_SEQ, 2, MAX_DIM)]


@pytest.mark.parametrize("shape", ATTENTION_SHAPES)
@pytest.mark.parametrize("spread", [1.0, 30.0])  # 30: scores far apart, exp underflows to 0
def test_short_attention_is_the_float64_function_and_its_gradients(shape, spread):
    batch, seq, heads, dim = shape
    torch.manual_seed(0)
    qkv = (torch.randn(batch, seq, 3, heads, dim) * spread**0.5).requires_grad_()
    qkv64 = qkv.detach().double().requires_grad_()
    grad = torch.randn(batch, seq, heads * dim)
    out, reference = short_attention(qkv, dim**-0.5), attention64(qkv64, dim**-0.5)
    out.backward(grad)
    reference.backward(grad.double())
    assert out.dtype == torch.float32 and out.shape == reference.shape
    torch.testing.assert_close(out.double(), reference, rtol=1e-5, atol=1e-5 * spread)
    for part in range(3):  # q, k and v's gradients
        torch.testing.assert_close(
            qkv.grad[:, :, part].double(), qkv64.grad[:, :, part], rtol=1e-5, atol=1e-5 * spread**1.5
        )


def test_short_attention_gives_the_same_bits_twice_at_any_thread_count_and_in_either_code_path():
    """Every sum of the kernel runs in a fixed order: its AVX2 code for the ViT's shape is its plain
    loops lane by lane, and (example, head) pairs are split among threads whole."""
    torch.manual_seed(1)
    qkv, grad = torch.randn(256, 6, 3, 4, 8), torch.randn(256, 6, 32)
    threads = torch.get_num_threads()
    made = []
    try:
        for count, generic in [(1, False), (1, False), (2, False), (1, True)]:
            torch.set_num_threads(count)
            out, probs = attention_forward(qkv, 0.25, generic=generic)
            made.append((out, probs, attention_backward(qkv, probs, grad, 0.25, generic=generic)))
    finally:
        torch.set_num_threads(threads)
    for other in made[1:]:
        assert all(torch.equal(a, b) for a, b in zip(made[0], other))


@pytest.mark.parametrize(
    ("channels", "kernel", "size"),
    [(1, (1, 8), (1, 40)), (3, (4, 4), (8, 12)), (3, (4, 4), (9, 12))],  # the last: not whole patches, the convolution
)
def test_a_patchifying_convolution_is_one_product_with_the_same_function_and_gradients(channels, kernel, size):
    torch.manual_seed(0)
    reference = torch.nn.Conv2d(channels, 16, kernel, stride=kernel)
    fast = use_engine_(torch.nn.Sequential(torch.nn.Conv2d(channels, 16, kernel, stride=kernel)), "fast")[0]
    fast.load_state_dict(reference.state_dict())
    assert isinstance(fast, PatchConv2d)
    x = torch.randn(5, channels, *size, requires_grad=True)
    x_fast = x.detach().clone().requires_grad_()
    out, out_fast = reference(x), fast(x_fast)
    grad = torch.randn_like(out)
    out.backward(grad)
    out_fast.backward(grad)
    torch.testing.assert_close(out_fast, out)
    torch.testing.assert_close(x_fast.grad, x.grad)
    for mine, theirs in zip(fast.parameters(), reference.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad)
    overlapping = use_engine_(torch.nn.Sequential(torch.nn.Conv2d(channels, 16, 3, stride=1)), "fast")[0]
    assert type(overlapping) is torch.nn.Conv2d


@pytest.mark.parametrize("spread", [1.0, 10.0])  # 10: deep into both tails
def test_the_gelu_kernel_is_the_float64_function_and_gradient(spread):
    torch.manual_seed(0)
    x = (torch.randn(4, 1003) * spread).requires_grad_()  # 1003: the 8-lane code and the scalar tail
    x64 = x.detach().double().requires_grad_()
    grad = torch.randn(4, 1003)
    out, reference = gelu(x), F.gelu(x64)
    out.backward(grad)
    reference.backward(grad.double())
    torch.testing.assert_close(out.double(), reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)
    # an element's bits do not depend on which code (lanes or tail) computed it
    assert torch.equal(gelu(x.detach().flatten()[3:]), gelu(x.detach()).flatten()[3:])
    assert type(use_engine_(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.GELU()), "fast")[1]) is KernelGELU
    assert (
        type(use_engine_(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.GELU("tanh")), "fast")[1]) is torch.nn.GELU
    )


def test_the_fast_engine_runs_timms_attention_in_the_kernel_where_it_fits():
    import timm

    torch.manual_seed(0)
    kwargs = dict(img_size=(1, 40), patch_size=(1, 8), in_chans=1, embed_dim=32, depth=2, num_heads=4, num_classes=10)
    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kwargs)
    fast = use_engine_(timm.create_model("vit_tiny_patch16_224", pretrained=False, **kwargs), "fast")
    fast.load_state_dict(reference.state_dict())
    attention = fast.blocks[0].attn
    assert type(attention).__name__ == "ShortAttention"
    x = torch.randn(16, 1, 1, 40)
    torch.testing.assert_close(fast(x), reference(x), rtol=1e-4, atol=1e-5)
    tokens = torch.randn(2, 6, 32)
    assert fits(attention, tokens, None, False)
    # what the kernel does not do takes timm's own forward (SDPA)
    assert not fits(attention, tokens.double(), None, False)
    assert not fits(attention, torch.randn(2, MAX_SEQ + 1, 32), None, False)
    assert not fits(attention, tokens, torch.zeros(6, 6, dtype=torch.bool), False)
    assert not fits(attention, tokens, None, True)
    attention.attn_drop.p = 0.1
    assert not fits(attention.train(), tokens, None, False) and fits(attention.eval(), tokens, None, False)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(
        attention(tokens, attn_mask=mask), reference.blocks[0].attn(tokens, attn_mask=mask), rtol=1e-4, atol=1e-5
    )


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


def train_steps(engine: str, steps: int = 3) -> list[torch.Tensor]:
    """The parameters of the MNIST-1D ViT's shape after `steps` SGD steps on fixed batches, in `engine`."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=(1, 40),
        patch_size=(1, 8),
        in_chans=1,
        embed_dim=32,
        depth=2,
        num_heads=4,
        num_classes=10,
    )
    use_engine_(model, engine)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(torch.randn(64, 1, 1, 40)), torch.randint(10, (64,))).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_the_fast_engine_trains_to_the_same_bits_twice_and_rounds_otherwise_than_the_reference_in_process():
    """The kernels' half of the slow test below, in a second: a few steps of the ViT's shape."""
    first, second, reference = train_steps("fast"), train_steps("fast"), train_steps("reference")
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not all(torch.equal(a, b) for a, b in zip(first, reference))
    for mine, theirs in zip(first, reference):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # three 4-epoch runs through the entry point (~70 s on 2 cores)
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


def test_a_run_signs_its_engine_unless_it_is_the_reference(compose, tmp_path, write_run):
    """Runs of protocols v1-v6 record no `engine` and keep their signatures; a run of engine=fast
    rounds otherwise, so its signature names the engine, and the study's stale-run check refuses a
    run made by the other engine. Resume still reads either engine as the same run's settings."""
    from horst_sparse.analysis import runs
    from horst_sparse.study.jobs import Job, stale
    from horst_sparse.training.no_effect import NO_EFFECT
    from horst_sparse.training.runner import config_differences

    reference = compose("vit", ["experiment=horst", "seed=10"])
    fast = compose("vit", ["experiment=horst", "seed=10", "engine=fast"])
    unrecorded = {k: v for k, v in reference.items() if k != "engine"}
    assert runs.signature_hash(unrecorded) == runs.signature_hash(reference) != runs.signature_hash(fast)
    assert "engine" not in runs.signature(reference) and runs.signature(fast)["engine"] == "fast"
    assert config_differences(reference, fast, ignore=NO_EFFECT) == []

    folders = {
        engine: write_run(tmp_path / engine, config, 0.9)
        for engine, config in [("reference", reference), ("fast", fast)]
    }
    # the signature of a run at the default engine has no `engine`: <absent>
    for engine, config, other, why in [
        ("fast", fast, "reference", "engine: <absent> -> fast"),
        ("reference", reference, "fast", "engine: fast -> <absent>"),
    ]:
        job = Job("vit", "embedded_vit", (), 10, f"run_{engine}", "", runs.signature_hash(config), config, "mnist1d")
        for made_by, expected in [(engine, []), (other, [f"run_{engine}: {why}"])]:
            frame = runs.scan([folders[made_by]]).frame.assign(run=job.run)
            assert stale([job], frame, {job.run: folders[made_by]}) == expected
