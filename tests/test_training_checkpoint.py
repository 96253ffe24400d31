"""training.checkpoint: atomic writes, weights_only loads, RNG capture, resume lookup."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from training.checkpoint import (
    CheckpointError,
    capture_rng_state,
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_old_checkpoints,
    resolve_resume,
    restore_training_state,
    save_checkpoint,
    training_state,
)
from training.schedule import build_lr_scheduler


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
        model=model, optimizer=optimizer, scheduler=scheduler, step=1, config={"lr": 0.1},
        generators={"data": generator}, masks=masks, epoch=0,
    )  # fmt: skip
    path = save_checkpoint(state, checkpoint_path(tmp_path, 1))
    expected = _draws(generator)

    fresh_model, fresh_optimizer, fresh_scheduler = _setup()
    fresh_generator = torch.Generator()
    rest = restore_training_state(
        load_checkpoint(path), model=fresh_model, optimizer=fresh_optimizer, scheduler=fresh_scheduler,
        generators={"data": fresh_generator},
    )  # fmt: skip
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
    with pytest.raises(CheckpointError, match=rf"cannot write checkpoint ckpt_00000002.pt: no space left in {folder} \(about 4.0 MiB needed, .* MiB free\)") as error:
        save_checkpoint(state, folder / "ckpt_00000002.pt")
    assert "\n" not in str(error.value)
    assert not list(folder.glob("*.tmp"))  # the partial file is gone ...
    if small_tmpfs:
        assert load_checkpoint(folder / "ckpt_00000001.pt")["small"].shape == (4,)  # ... earlier ones are intact


def test_read_only_folder_is_one_line(tmp_path):
    import subprocess

    folder = tmp_path / "ro"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("cannot mount a read-only filesystem here (and root ignores permission bits)")
    try:
        with pytest.raises(CheckpointError, match=f"{folder} is not writable \\(Read-only file system\\); choose a writable run folder"):
            save_checkpoint({"x": torch.zeros(2)}, folder / "ckpt_00000001.pt")
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)
