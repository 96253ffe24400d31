"""horst_sparse.training.checkpoint: atomic writes, weights_only loads, RNG capture, resume lookup; DCP
folders of FSDP2-sharded models."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from horst_sparse.training.checkpoint import (
    CheckpointError,
    capture_rng_state,
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_old_checkpoints,
    resolve_resume,
    restore_rng_state,
    restore_training_state,
    save_checkpoint,
    step_checkpoint,
    training_state,
)
from horst_sparse.training.schedule import build_lr_scheduler


def _draws(generator: torch.Generator) -> tuple:
    return random.random(), np.random.rand(), torch.rand(1).item(), torch.rand(1, generator=generator).item()


def _setup():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = build_lr_scheduler(optimizer, total_steps=10, warmup_steps=2, min_lr=0.01)
    return model, optimizer, scheduler


def test_training_state_round_trip_restores_everything(tmp_path):
    model, optimizer, scheduler = _setup()
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    scheduler.step_update(1)
    generator = torch.Generator().manual_seed(7)
    masks = {"weight": torch.rand(2, 3) > 0.5}
    state = training_state(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        step=1,
        config={"lr": 0.1},
        generators={"data": generator},
        masks=masks,
        epoch=0,
    )
    path = save_checkpoint(state, checkpoint_path(tmp_path, 1))
    expected = _draws(generator)

    fresh_model, fresh_optimizer, fresh_scheduler = _setup()
    fresh_generator = torch.Generator()
    rest = restore_training_state(
        load_checkpoint(path),
        model=fresh_model,
        optimizer=fresh_optimizer,
        scheduler=fresh_scheduler,
        generators={"data": fresh_generator},
    )
    assert _draws(fresh_generator) == expected  # python, numpy, torch and the named generator
    assert rest["step"] == 1 and rest["epoch"] == 0 and rest["config"] == {"lr": 0.1}
    assert torch.equal(rest["masks"]["weight"], masks["weight"])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh_model.state_dict().values()))
    assert fresh_optimizer.state_dict()["state"][0]["step"] == 1
    assert fresh_scheduler.state_dict() == scheduler.state_dict()


def test_atomic_names_listing_and_pruning(tmp_path):
    for step in (3, 12, 7):
        save_checkpoint({"step": step}, checkpoint_path(tmp_path, step))
    (tmp_path / "ckpt_00000099.pt.tmp").write_bytes(b"partial")  # an interrupted write
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_00000003.pt", "ckpt_00000007.pt", "ckpt_00000012.pt"]
    assert latest_checkpoint(tmp_path).name == "ckpt_00000012.pt"
    assert resolve_resume("auto", tmp_path) == latest_checkpoint(tmp_path)
    assert resolve_resume("never", tmp_path) is None
    assert resolve_resume("auto", tmp_path / "empty") is None
    prune_old_checkpoints(tmp_path, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_00000007.pt", "ckpt_00000012.pt"]
    with pytest.raises(CheckpointError, match="no such checkpoint file"):
        resolve_resume(str(tmp_path / "missing.pt"), tmp_path)


def test_corrupt_checkpoint_is_a_clear_error_naming_the_file(tmp_path):
    path = save_checkpoint({"w": torch.randn(1000)}, tmp_path / "ckpt_00000001.pt")
    path.write_bytes(path.read_bytes()[:500])  # truncated
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is unreadable"):
        load_checkpoint(path)


def test_loading_never_unpickles_arbitrary_objects(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"obj": object()}, path)
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path)


def test_rng_state_survives_weights_only(tmp_path):
    state = capture_rng_state()
    save_checkpoint(state, tmp_path / "rng.pt")
    loaded = load_checkpoint(tmp_path / "rng.pt")
    assert loaded["python"][1] == state["python"][1]
    assert torch.equal(loaded["numpy"]["state"]["key"], state["numpy"]["state"]["key"])


def test_cuda_rng_states_go_to_the_devices_this_process_sees(monkeypatch):
    """A checkpoint of a process that saw two GPUs, resumed by one that sees one (a requeue onto
    another allocation): the first device's state is restored, the other has no device here.
    There is no GPU here: torch.cuda's calls are stood in for."""
    state = capture_rng_state()
    state["cuda"] = [torch.full((16,), 1, dtype=torch.uint8), torch.full((16,), 2, dtype=torch.uint8)]
    restored = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda new_state, device: restored.update({device: new_state}))
    restore_rng_state(state)
    assert list(restored) == [0] and torch.equal(restored[0], state["cuda"][0])


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 1 MiB filesystem (tmpfs, mounted here when the machine lets us), or None."""
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode:
        yield None
        return
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)  # lazy: a failed writer may still hold the file


def test_full_disk_is_one_line_with_the_space_needed_and_leaves_no_partial_file(small_tmpfs, tmp_path, monkeypatch):
    state = {"weights": torch.zeros(1024, 1024)}  # 4 MiB: does not fit
    if small_tmpfs is None:  # no mount here: the error torch's writer raises on a full disk, simulated
        folder = tmp_path / "full"

        def full_disk(obj, path, *args, **kwargs):
            open(path, "wb").write(b"\0" * 1024)
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1024 vs 64")

        monkeypatch.setattr(torch, "save", full_disk)
    else:
        folder = small_tmpfs
    save_checkpoint({"small": torch.zeros(4)}, folder / "ckpt_00000001.pt") if small_tmpfs else None
    with pytest.raises(
        CheckpointError,
        match=rf"cannot write checkpoint ckpt_00000002.pt: no space left in {folder} \(about 4.0 MiB needed, .* MiB free\)",
    ) as error:
        save_checkpoint(state, folder / "ckpt_00000002.pt")
    assert "\n" not in str(error.value)
    assert not list(folder.glob("*.tmp"))  # the partial file is gone ...
    if small_tmpfs:
        assert load_checkpoint(folder / "ckpt_00000001.pt")["small"].shape == (4,)  # ... earlier ones are intact


def test_read_only_folder_is_one_line(tmp_path):
    import subprocess

    folder = tmp_path / "ro"
    folder.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(folder)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a read-only filesystem here (and root ignores permission bits)")
    try:
        with pytest.raises(
            CheckpointError, match=f"{folder} is not writable \\(Read-only file system\\); choose a writable run folder"
        ):
            save_checkpoint({"x": torch.zeros(2)}, folder / "ckpt_00000001.pt")
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def test_dcp_folder_is_written_atomically_listed_and_pruned_like_a_file(tmp_path):
    """One process, no process group: DCP writes the folder alone."""
    for step in (2, 4, 6):
        save_checkpoint(
            {"model": {"w": torch.full((3,), float(step))}, "optimizer": {}, "step": step},
            checkpoint_path(tmp_path, step, sharded=True),
        )
    (tmp_path / "ckpt_00000008.dcp.tmp").mkdir()  # an interrupted write
    (tmp_path / "ckpt_00000001.pt.diverged").write_bytes(b"set aside")
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "ckpt_00000002.dcp",
        "ckpt_00000004.dcp",
        "ckpt_00000006.dcp",
    ]
    assert resolve_resume("auto", tmp_path) == tmp_path / "ckpt_00000006.dcp"
    assert step_checkpoint(tmp_path, 4) == tmp_path / "ckpt_00000004.dcp" and step_checkpoint(tmp_path, 5) is None
    prune_old_checkpoints(tmp_path, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt_00000001.pt.diverged",
        "ckpt_00000006.dcp",
        "ckpt_00000008.dcp.tmp",
    ]
    state = load_checkpoint(tmp_path / "ckpt_00000006.dcp")
    assert state["step"] == 6 and torch.equal(state["model"]["w"], torch.full((3,), 6.0))
    assert "model" not in load_checkpoint(tmp_path / "ckpt_00000006.dcp", weights=False)
    (tmp_path / "ckpt_00000006.dcp" / "state.pt").write_bytes(b"garbled")
    with pytest.raises(CheckpointError, match="ckpt_00000006.dcp is unreadable"):
        load_checkpoint(tmp_path / "ckpt_00000006.dcp")


FSDP2_RESUME = """
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from horst_sparse.training.checkpoint import checkpoint_path, load_checkpoint, restore_training_state, save_checkpoint, training_state
from horst_sparse.training.distributed import init_distributed, is_sharded, parallelize
from horst_sparse.training.schedule import build_lr_scheduler

info = init_distributed("cpu")
folder = Path(sys.argv[1])


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 5))
    parallelize(model, "fsdp2", info=info, device=torch.device("cpu"), blocks=[model[0], model[2]])
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    return model, optimizer, build_lr_scheduler(optimizer, total_steps=6, warmup_steps=1, min_lr=0.01)


def train(model, optimizer, scheduler, steps, start):
    for step in range(start, start + steps):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * step + info.rank))
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step_update(step + 1)


def whole(model):
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


model, optimizer, scheduler = build()
assert is_sharded(model)
train(model, optimizer, scheduler, 3, 0)
path = save_checkpoint(training_state(model=model, optimizer=optimizer, scheduler=scheduler, step=3, config={}),
                       checkpoint_path(folder, 3, sharded=True))
at_3 = whole(model)
train(model, optimizer, scheduler, 3, 3)
expected = whole(model)

model, optimizer, scheduler = build()  # a fresh start that resumes
rest = restore_training_state(load_checkpoint(path, weights=False), model=model, optimizer=optimizer,
                              scheduler=scheduler, path=path)
train(model, optimizer, scheduler, 3, rest["step"])
for name, tensor in whole(model).items():
    assert torch.equal(tensor, expected[name]), name
if info.is_main:
    torch.save(at_3, folder / "at_3.pt")
dist.destroy_process_group()
"""


def test_fsdp2_checkpoint_of_two_processes_resumes_exactly_and_reads_whole_without_them(tmp_path):
    """torch.distributed.checkpoint under FSDP2 (2 gloo processes): each process writes and
    reads back its shards, and the run continues bitwise as if never stopped; the folder
    also reads whole in a plain process (tools, export)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "resume.py"
    script.write_text(FSDP2_RESUME)
    root = Path(__file__).resolve().parents[1]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        str(tmp_path),
    ]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    state = load_checkpoint(tmp_path / "ckpt_00000003.dcp")
    assert state["step"] == 3 and set(state) >= {"model", "optimizer", "scheduler", "rng"}
    at_3 = torch.load(tmp_path / "at_3.pt", weights_only=True)
    assert state["model"].keys() == at_3.keys()
    assert all(torch.equal(state["model"][name], at_3[name]) for name in at_3)
    moments = state["optimizer"]["state"]["0.weight"]
    assert moments["exp_avg"].shape == (8, 6) and moments["step"] == 3
