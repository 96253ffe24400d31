"""No update of either pipeline waits for the device: every step of a real run (the pipeline's own
`train_step`: forward, loss, backward, clip, optimizer, LR schedule and the metrics kept between
log intervals) runs under a mode that records each read of a tensor's values by the host. On a
GPU each such read is a sync that empties the device's queue; on the CPU the same calls are made,
so the CPU run proves it. Two kinds of tensors are CPU tensors on a GPU too, whose reads wait for
nothing: the optimizer's step counters, and GPT-2's window offsets (`RandomWindows` draws them from
its CPU generator and reads them to slice the token file)."""

from __future__ import annotations

import traceback

import pytest
import torch
from conftest import _compose, compose_cfg, deit_overrides, tiny_overrides
from omegaconf import OmegaConf
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from horst_sparse.gpt2 import run as gpt2_run
from horst_sparse.vit import run as vit_run

pytestmark = pytest.mark.usefixtures("quiet_single_threaded")

aten = torch.ops.aten
# Ops whose result the host needs from the tensor's values: a scalar, or an output sized by them.
READS = {
    aten._local_scalar_dense.default,  # .item(), bool(), int(), float()
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,  # also a boolean mask as an index
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
}
# Methods that read the values without going through an op on a CPU tensor.
METHODS = {torch.Tensor.tolist, torch.Tensor.numpy}
HOST_DATA = f"{gpt2_run.__file__.rsplit('/', 1)[0]}/data.py:"  # RandomWindows' offsets


class HostReads:
    """Records the host reads made inside it: (what, the tensor's storage, the line of this
    repository's code or the library that made it)."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, int, str]] = []
        parent = self

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func in READS:
                    parent._note(str(func), args[0])
                return func(*args, **(kwargs or {}))

        class Methods(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if func in METHODS:
                    parent._note(func.__name__, args[0])
                return func(*args, **(kwargs or {}))

        self._modes = (Ops(), Methods())

    def _note(self, what: str, tensor: torch.Tensor) -> None:
        frames = [
            f
            for f in traceback.extract_stack()
            if f.filename != __file__ and ("/torch/" not in f.filename or "/optim/" in f.filename)
        ]
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "torch"
        self.reads.append((what, tensor.untyped_storage().data_ptr(), where))

    def __enter__(self) -> HostReads:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


def step_counters(optimizer: torch.optim.Optimizer) -> set[int]:
    """The storages of the optimizer's step counters (CPU tensors on any device)."""
    return {
        state["step"].untyped_storage().data_ptr()
        for state in optimizer.state.values()
        if isinstance(state.get("step"), torch.Tensor)
    }


def record_steps(monkeypatch, module) -> list[list[tuple[str, int, str]]]:
    """Runs `module.train_step` under `HostReads`; each update's reads but the step counters'."""
    updates = []
    step = module.train_step

    def recorded(*args, **kwargs):
        with HostReads() as host:
            loss = step(*args, **kwargs)
        counters = step_counters(args[2])
        updates.append([r for r in host.reads if r[1] not in counters and not r[2].startswith(HOST_DATA)])
        return loss

    monkeypatch.setattr(module, "train_step", recorded)
    return updates


@pytest.mark.parametrize("optimizer", ["horst", "adamw"])
def test_a_gpt2_update_reads_nothing_from_the_device(pydoc_dir, tmp_path, monkeypatch, optimizer):
    updates = record_steps(monkeypatch, gpt2_run)
    overrides = tiny_overrides(pydoc_dir, f"optimizer={optimizer}", "train.max_steps=4", "train.grad_clip=1.0")
    gpt2_run.run(compose_cfg(overrides), run_dir=tmp_path / "run")
    assert len(updates) == 4 and updates == [[]] * 4


def test_a_vit_update_reads_nothing_from_the_device(imagenet_root, tmp_path, monkeypatch):
    """The DeiT recipe: Mixup/CutMix, drop path, gradient accumulation, the clip, AC/DC's masks."""
    updates = record_steps(monkeypatch, vit_run)
    cfg = _compose(deit_overrides(imagenet_root, "train.accum_steps=2", "train.grad_clip=1.0", "compile=false"))
    vit_run.run(cfg, run_dir=tmp_path / "run")
    assert len(updates) == 18 and updates == [[]] * 18  # 3 updates in each of 6 epochs


def test_transformers_own_sdpa_mask_reads_the_device_in_each_forward():
    """What the pipeline's GPT-2 (`WHOLE_WINDOWS`) avoids, seen by the same recorder: transformers'
    "sdpa" looks for packed sequences in the position ids by reading them once per eager forward."""
    from horst_sparse.gpt2.model import build_model

    nano = OmegaConf.create(
        dict(name="n", n_layer=1, n_head=2, n_embd=16, n_positions=16, dropout=0.0, tie_word_embeddings=True)
    )
    model = build_model(nano, vocab_size=100)
    tokens = torch.randint(100, (2, 16))
    with HostReads() as ours:
        logits = model(tokens).logits
    plain = type(model)(model.config.__class__(**{**model.config.to_dict(), "attn_implementation": "sdpa"}))
    plain.load_state_dict(model.state_dict())
    with HostReads() as theirs:
        plain_logits = plain(tokens).logits
    assert ours.reads == []
    assert [where.split("/")[-1].split(":")[0] for _, _, where in theirs.reads] == ["masking_utils.py"]
    assert torch.equal(logits, plain_logits)  # the same attention: SDPA, causal
