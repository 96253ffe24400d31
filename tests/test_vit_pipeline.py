"""End-to-end tests of train_vit.py on CPU: a tiny ImageNet-layout folder through the DeiT
recipe under AC/DC, resume in the middle of a compressed phase, the embedded default, CLI errors."""

from __future__ import annotations

import json
import math
import re
import sys

import pytest
import torch
from conftest import CLASSES, QUIET_ENV, ROOT, _compose, _load_entry_point, deit_overrides, read_records
from PIL import Image

import horst_sparse.vit.run as vit_run_module
import pruning
from horst_sparse.training import runner
from horst_sparse.training.config import ConfigError
from horst_sparse.training.runner import NON_FINITE_EXIT_CODE
from horst_sparse.vit.config import validate
from horst_sparse.vit.run import run

pytestmark = pytest.mark.usefixtures("quiet_env")

train_vit = _load_entry_point("train_vit")

# The phases of deit_overrides' schedule (conftest.SHORT_ACDC), by epoch.
EXPECTED_PHASES = ["dense", "compressed", "compressed", "decompressed", "compressed", "compressed"]


@pytest.fixture(scope="module")
def deit_run(imagenet_root, tmp_path_factory):
    """One run of the tiny DeiT setting, watched: the optimizer's first moments right after
    every restore, the prunable weights at the end of every epoch."""
    run_dir = tmp_path_factory.mktemp("deit_run")
    watched = {"moments_after_restore": [], "zeros_per_epoch": [], "prune_calls": []}
    original_reset, original_evaluate = pruning.reset_optimizer_moments, vit_run_module.evaluate
    original_prune = pruning.Sparsifier.prune

    def prune_and_record(sparsifier, sparsity, **kwargs):
        watched["prune_calls"].append((len(watched["zeros_per_epoch"]), sparsity, kwargs))
        return original_prune(sparsifier, sparsity, **kwargs)

    def reset_and_record(optimizer, params, **kwargs):
        original_reset(optimizer, params, **kwargs)
        watched["moments_after_restore"].append(
            [optimizer.state[p]["exp_avg"].abs().max().item() for p in params.values()]
        )

    def evaluate_and_record(model, *args, **kwargs):
        weights = pruning.prunable_parameters(model, "vit")
        watched["zeros_per_epoch"].append({n: (w == 0).clone() for n, w in weights.items()})
        return original_evaluate(model, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pruning, "reset_optimizer_moments", reset_and_record)
        patch.setattr(vit_run_module, "evaluate", evaluate_and_record)
        patch.setattr(pruning.Sparsifier, "prune", prune_and_record)
        # W&B offline here (disabled elsewhere): the weight histograms go to W&B as well.
        overrides = deit_overrides(imagenet_root, "logging.mode=offline")
        summary = run(_compose(overrides), run_dir=run_dir)
    return summary, run_dir, watched


def test_tiny_imagefolder_end_to_end(deit_run):
    summary, run_dir, _ = deit_run
    for name in ("summary.json", "config.yaml", "metrics.jsonl", "wandb_id.txt"):
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    # Self-describing for the result tables: model, optimizer and its hyperparameters, sparsity, accuracy, seed.
    assert summary["pipeline"] == "vit" and summary["model"]["preset"] == "vit_nano"
    assert summary["model"]["timm_name"] == "vit_tiny_patch16_224" and summary["model"]["num_classes"] == 3
    opt = summary["optimizer"]
    assert (opt["name"], opt["alpha"], opt["beta"], opt["weight_decay"], opt["lr"]) == ("horst", 10.0, 0.1, 0.05, 5e-4)
    assert summary["data"] == {
        "name": "imagefolder",
        "root": str(summary["data"]["root"]),
        "train_images": 24,
        "val_images": 6,
        "num_classes": 3,
        "skipped_images": [],
        "splits": {
            "train": "train/ less the 6 minival images",
            "validation": "minival: 6 images held out of train/ (minival.txt)",
            "test": "val/ (the official validation set)",
        },
    }
    assert summary["seed"] == 0 and summary["target_sparsity"] == 0.8 and summary["final_phase"] == "compressed"
    assert summary["acdc"]["prune_epochs"] == [1, 4] and summary["acdc"]["restore_epochs"] == [3]
    assert summary["train"]["steps"] == 6 * 3 and summary["train"]["epochs"] == 6
    assert 0 <= summary["top1"] <= summary["top5"] <= 1
    assert summary["top1"] == summary["epochs"][-1]["top1"]
    assert [e["phase"] for e in summary["epochs"]] == EXPECTED_PHASES
    assert sorted(p.name for p in run_dir.glob("ckpt_*.pt")) == ["ckpt_00000015.pt", "ckpt_00000018.pt"]

    records = read_records(run_dir)
    epochs = [r for r in records if "val/top1" in r]
    assert [(r["epoch"], r["val/phase"], r["val/phase_id"]) for r in epochs] == [
        (e, phase, {"dense": 0, "compressed": 1, "decompressed": 2}[phase]) for e, phase in enumerate(EXPECTED_PHASES)
    ]
    assert [r["step"] for r in epochs] == [3, 6, 9, 12, 15, 18]
    layers = [k for k in epochs[0] if k.startswith("sparsity/") and k != "sparsity/overall"]
    assert len(layers) == 2 * 4 and "sparsity/blocks.1.mlp.fc2.weight" in layers
    histograms = [r for r in records if "weights/log10_abs_counts" in r]
    assert len(histograms) == 6
    assert (
        len(histograms[-1]["weights/log10_abs_counts"]) == 100 and len(histograms[-1]["weights/log10_abs_edges"]) == 101
    )
    # Non-zero weights only: the final model's histogram counts the 20 % that survive.
    numel = summary["model"]["prunable_parameters"]
    assert sum(histograms[-1]["weights/log10_abs_counts"]) == numel - math.floor(0.8 * numel)
    assert [r["step"] for r in records if "train/loss" in r] == [2, 4, 6, 8, 10, 12, 14, 16, 18]


def test_acdc_phases_change_on_schedule_with_exact_target_sparsity(deit_run):
    summary, _, watched = deit_run
    numel = summary["model"]["prunable_parameters"]
    exact = math.floor(0.8 * numel) / numel  # global magnitude pruning: exactly floor(s * n) zeros
    for record in summary["epochs"]:
        if record["phase"] == "compressed":
            assert record["sparsity"] == exact, record
        else:
            assert record["sparsity"] < 0.01, record  # dense, or pruned weights grown back
    assert summary["measured_sparsity"] == exact
    assert sum(summary["per_layer_sparsity"].values()) / len(summary["per_layer_sparsity"]) > 0.5

    zeros = watched["zeros_per_epoch"]
    # Within a compressed phase the mask is held: the same weights are zero after every epoch.
    assert all(torch.equal(zeros[1][n], zeros[2][n]) for n in zeros[1])
    assert all(torch.equal(zeros[4][n], zeros[5][n]) for n in zeros[4])
    # Each compressed phase computes its mask afresh (global magnitude), at its first epoch.
    unstructured = {"scope": "global", "pattern": "unstructured"}
    assert watched["prune_calls"] == [(1, 0.8, unstructured), (4, 0.8, unstructured)]
    # One restore (epoch 3), and the first moments of the prunable weights were reset there.
    assert len(watched["moments_after_restore"]) == 1
    assert max(watched["moments_after_restore"][0]) == 0.0


class Interrupted(Exception):
    pass


def test_resume_mid_compressed_phase_matches_uninterrupted_run(deit_run, imagenet_root, tmp_path, monkeypatch):
    _, reference, _ = deit_run
    overrides = deit_overrides(imagenet_root, "train.keep_checkpoints=10")
    save_checkpoint = runner.save_checkpoint

    def save_then_die_after_epoch_1(state, path):
        save_checkpoint(state, path)
        if state["epoch"] == 2:  # epoch 1 done; epoch 2 is the second of the compressed phase 1-2
            raise Interrupted

    run_dir = tmp_path / "interrupted"
    monkeypatch.setattr(runner, "save_checkpoint", save_then_die_after_epoch_1)
    with pytest.raises(Interrupted):
        run(_compose(overrides), run_dir=run_dir)
    monkeypatch.setattr(runner, "save_checkpoint", save_checkpoint)
    from horst_sparse.training.checkpoint import load_checkpoint

    interrupted_at = load_checkpoint(run_dir / "ckpt_00000006.pt")
    assert interrupted_at["epoch"] == 2 and interrupted_at["batch"] == 0 and interrupted_at["masks"]["masks"]
    # As written before mid-epoch checkpoints (tests/test_vit_preemption.py): no batch offset.
    old_format = {k: v for k, v in interrupted_at.items() if k not in ("batch", "epoch_loss", "world_size")}
    torch.save(old_format, run_dir / "ckpt_00000006.pt")

    summary = run(_compose(overrides), run_dir=run_dir)

    # The epoch-2 checkpoint of the resumed run kept the masks it was resumed with.
    resumed_epoch_2 = load_checkpoint(run_dir / "ckpt_00000009.pt")["masks"]["masks"]
    assert all(torch.equal(resumed_epoch_2[n], m) for n, m in interrupted_at["masks"]["masks"].items())
    expected = load_checkpoint(reference / "ckpt_00000018.pt")
    actual = load_checkpoint(run_dir / "ckpt_00000018.pt")
    assert expected["model"].keys() == actual["model"].keys()
    for name in expected["model"]:
        assert torch.equal(expected["model"][name], actual["model"][name]), name
    assert summary["epochs"] == json.loads((reference / "summary.json").read_text())["epochs"]
    # The log reads as an uninterrupted run's (checkpoint markers aside: this run kept more).
    strip = lambda records: [r for r in records if r.get("event") != "checkpoint"]  # noqa: E731
    assert strip(read_records(run_dir)) == strip(read_records(reference))


def test_gradient_accumulation_gives_the_update_of_the_whole_batch(imagenet_root, tmp_path):
    """train.accum_steps=2 (two passes of 4 images, Mixup/CutMix over the whole 8) trains the
    weights of one pass of 8, to float rounding (no drop path: it draws per pass). SGD: its
    update is linear in the gradient, so a gradient off by the factor 2 would show."""
    from horst_sparse.training.checkpoint import latest_checkpoint, load_checkpoint

    weights, losses = {}, {}
    for accum in (1, 2):
        overrides = deit_overrides(
            imagenet_root, "optimizer=sgd", "model.drop_path=0", f"train.accum_steps={accum}", "logging.mode=disabled"
        )
        summary = run(_compose(overrides), run_dir=tmp_path / f"accum{accum}")
        weights[accum] = load_checkpoint(latest_checkpoint(tmp_path / f"accum{accum}"))["model"]
        losses[accum] = [epoch["train_loss"] for epoch in summary["epochs"]]
        assert summary["train"]["steps"] == 18
    assert losses[2] == pytest.approx(losses[1], rel=1e-5)
    for name, value in weights[1].items():
        torch.testing.assert_close(weights[2][name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert any(not torch.equal(weights[2][n], v) for n, v in weights[1].items())  # two passes really ran


def test_embedded_default_with_fewer_epochs(tmp_path, monkeypatch, capsys):
    """`python train_vit.py` (digits, 90 %), with 5 epochs instead of 40: dense 0, compressed 1,
    decompressed 2, compressed 3-4."""
    run_dir = tmp_path / "default"
    short = [
        "train.epochs=5",
        "train.warmup_epochs=1",
        "acdc.dense_warmup=1",
        "acdc.compressed=1",
        "acdc.decompressed=1",
        "acdc.final_decompressed=1",
        "acdc.final_compressed=2",
    ]
    monkeypatch.setattr(sys, "argv", ["train_vit.py", *short, f"hydra.run.dir={run_dir}"])
    train_vit.main()
    printed = capsys.readouterr().out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["data"]["name"] == "digits" and summary["data"]["val_images"] == 360
    assert summary["model"]["preset"] == "vit_digits" and summary["optimizer"]["name"] == "horst"
    assert summary["measured_sparsity"] == pytest.approx(0.9, abs=1e-5) and summary["final_phase"] == "compressed"
    assert summary["top1"] > 0.3  # 10 classes: chance is 0.1
    assert f"top-1 {summary['top1']:.4f}" in printed and "measured sparsity 0.9000" in printed


def test_cli_errors_are_one_line_and_nonzero(tmp_path, monkeypatch, capsys):
    cases = [
        (["train.epochs=41"], "error: acdc phases do not fit train.epochs=41"),
        (["experiment=deit_tiny_acdc_s70"], "error: device=cuda, but"),  # a GPU recipe on this CPU machine
        (
            ["experiment=deit_tiny_acdc_s70", "device=cpu"],
            "error: data.root is not set; pass data.root=/path/to/imagenet",
        ),
        (
            ["experiment=deit_tiny_acdc_s70", "device=cpu", f"data.root={tmp_path}/none"],
            f"error: data.root={tmp_path}/none does not exist",
        ),
    ]
    for overrides, message in cases:
        monkeypatch.setattr(sys, "argv", ["train_vit.py", *overrides, f"hydra.run.dir={tmp_path / 'run'}"])
        with pytest.raises(SystemExit) as exit_info:
            train_vit.main()
        assert exit_info.value.code == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(message)


def test_non_finite_loss_exits_nonzero_and_keeps_last_good_checkpoint(imagenet_root, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    # alpha * lr = 1e5: the mirror step blows the weights up within a few updates.
    overrides = deit_overrides(imagenet_root, "train.base_lr=1.0", "train.min_lr=0.1", "optimizer.alpha=1e5")
    monkeypatch.setattr(sys, "argv", ["train_vit.py", *overrides, f"hydra.run.dir={run_dir}"])
    with pytest.raises(SystemExit) as exit_info:
        train_vit.main()
    assert exit_info.value.code == NON_FINITE_EXIT_CODE
    message = capsys.readouterr().err
    assert "training loss is nan" in message or "training loss is inf" in message
    checkpoints = sorted(run_dir.glob("ckpt_*.pt"))
    assert f"Last good checkpoint: {checkpoints[-1] if checkpoints else 'none yet'}" in message
    assert not (run_dir / "summary.json").exists()


@pytest.mark.slow
def test_ddp_two_processes_with_repeated_augmentation(imagenet_root, tmp_path):
    import os
    import subprocess

    run_dir = tmp_path / "ddp"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "train_vit.py"),
        *deit_overrides(imagenet_root),
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, **QUIET_ENV, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["train"]["world_size"] == 2
    # RepeatAugSampler: each process takes len(dataset) / 2 = 12 images per epoch, 3 updates
    # of 4; every validation image is counted once over both processes.
    assert summary["train"]["steps"] == 6 * 3
    assert summary["data"]["val_images"] == 6
    numel = summary["model"]["prunable_parameters"]
    assert summary["measured_sparsity"] == math.floor(0.8 * numel) / numel
    assert [e["phase"] for e in summary["epochs"]] == EXPECTED_PHASES


def test_a_corrupt_image_is_one_line_naming_it_or_skipped_and_counted(imagenet_root, tmp_path, monkeypatch, capsys):
    import shutil

    root = tmp_path / "imagenet"
    shutil.copytree(imagenet_root, root)
    bad = root / "train" / CLASSES[0] / "broken.JPEG"
    Image.new("RGB", (20, 20)).save(bad, format="JPEG")
    bad.write_bytes(bad.read_bytes()[:100])  # cut short, as a failed copy leaves it
    # Loaded in a DataLoader worker (data.num_workers=1): the error still names the file, in one line.
    monkeypatch.setattr(sys, "argv", ["train_vit.py", *deit_overrides(root), f"hydra.run.dir={tmp_path / 'run'}"])
    with pytest.raises(SystemExit) as exit_info:
        train_vit.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    err = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", err)  # tqdm's cursor moves
    (line,) = [line for line in err.splitlines() if "error" in line.lower()]  # the progress bar aside
    assert line.startswith(f"error: {bad} cannot be read as an image") and "data.skip_corrupt=true" in line
    assert "Traceback" not in err

    summary = run(_compose(deit_overrides(root, "data.skip_corrupt=true")), run_dir=tmp_path / "skipping")
    assert summary["data"]["skipped_images"] == [str(bad)]


def test_acdc_with_two_of_four_masks_keeps_two_of_every_four_inputs(imagenet_root, tmp_path):
    summary = run(
        _compose(deit_overrides(imagenet_root, "acdc.pattern=2:4", "acdc.sparsity=0.5")), run_dir=tmp_path / "run"
    )
    from horst_sparse.training.checkpoint import latest_checkpoint, load_checkpoint

    weights = load_checkpoint(latest_checkpoint(tmp_path / "run"))["model"]
    for name in ("blocks.0.attn.qkv.weight", "blocks.1.mlp.fc2.weight"):  # timm Linear: [out, in]
        groups = weights[name].reshape(weights[name].shape[0], -1, 4)
        assert ((groups != 0).sum(-1) == 2).all(), name
    assert summary["measured_sparsity"] == pytest.approx(0.5) and summary["final_phase"] == "compressed"
    with pytest.raises(ConfigError, match=r"acdc.pattern=2:4 prunes 0.5 of the weights; set acdc.sparsity=0.5"):
        validate(_compose(deit_overrides(imagenet_root, "acdc.pattern=2:4")), world_size=1)
