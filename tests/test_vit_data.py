"""ViT data: ImageNet-layout checks, the digits dataset, timm transforms, epoch-seeded loaders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from horst_sparse.vit.data import (
    DataLayoutError,
    DigitsDataset,
    TrainLoader,
    build_transforms,
    check_imagefolder_root,
    eval_loader,
)

REPO = Path(__file__).resolve().parents[1]
TINY_AUG = dict(
    auto_augment=None,
    color_jitter=0.0,
    hflip=0.0,
    scale=[0.7, 1.0],
    interpolation="bicubic",
    re_prob=0.0,
    re_mode="pixel",
    re_count=1,
    crop_pct=1.0,
)
DEIT_AUG = dict(
    auto_augment="rand-m9-mstd0.5-inc1",
    color_jitter=0.4,
    hflip=0.5,
    scale=[0.08, 1.0],
    interpolation="bicubic",
    re_prob=0.25,
    re_mode="pixel",
    re_count=1,
    crop_pct=0.875,
)


def _png(path, color=(200, 30, 30)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (12, 12), color).save(path)


@pytest.fixture
def imagenet_root(tmp_path):
    for split in ("train", "val"):
        for cls in ("n01440764", "n01443537"):
            _png(tmp_path / split / cls / "img0.png")
    return tmp_path


def test_valid_root_gives_its_classes(imagenet_root):
    assert check_imagefolder_root(str(imagenet_root)) == ["n01440764", "n01443537"]


@pytest.mark.parametrize(
    "breakage,message",
    [
        ("unset", "data.root is not set; pass data.root=/path/to/imagenet"),
        ("missing", "does not exist or is not a folder"),
        ("no_val", "has no val/ folder"),
        (
            "flat_val",
            r"val/ has no class folders \(2 images lie directly in it: sort them into one folder per class; "
            r"scripts/prepare_imagenet.py does so from the official archives\)",
        ),
        ("mismatch", r"not the same ones \(only in train: \['n01443537'\], only in val: \['n99999999'\]\)"),
        ("empty_class", "Found no valid file for the classes n01443537"),
    ],
)
def test_malformed_root_is_one_line_error_naming_the_layout(imagenet_root, breakage, message):
    root = str(imagenet_root)
    if breakage == "unset":
        root = None
    elif breakage == "missing":
        root = str(imagenet_root / "nowhere")
    elif breakage == "no_val":
        for f in (imagenet_root / "val").rglob("*.png"):
            f.unlink()
        for d in sorted((imagenet_root / "val").rglob("*"), reverse=True):
            d.rmdir()
        (imagenet_root / "val").rmdir()
    elif breakage == "flat_val":
        for i, f in enumerate(sorted((imagenet_root / "val").rglob("*.png"))):
            f.rename(imagenet_root / "val" / f"ILSVRC2012_val_{i:08d}.png")
            f.parent.rmdir()
    elif breakage == "mismatch":
        (imagenet_root / "val" / "n01443537").rename(imagenet_root / "val" / "n99999999")
    elif breakage == "empty_class":
        (imagenet_root / "train" / "n01443537" / "img0.png").unlink()

    with pytest.raises(DataLayoutError, match=message) as error:
        if breakage == "empty_class":
            from horst_sparse.vit.data import build_datasets

            build_datasets({"name": "imagefolder", "root": root, "minival_size": 1}, TINY_AUG, img_size=12)
        else:
            check_imagefolder_root(root)
    assert "\n" not in str(error.value)
    assert "expected an ImageNet-style ImageFolder root" in str(error.value)


def test_digits_splits_are_disjoint_stratified_fixed_and_pil():
    splits = {s: DigitsDataset(s, val_fraction=0.2, test_fraction=0.2) for s in ("train", "validation", "test")}
    assert [len(d) for d in splits.values()] == [1078, 360, 359]
    indices = [set(d.indices.tolist()) for d in splits.values()]
    assert set.union(*indices) == set(range(1797)) and sum(map(len, indices)) == 1797  # disjoint, all used
    for d in splits.values():
        assert sorted(set(d.targets)) == list(range(10)) and min(np.bincount(d.targets)) >= 35
    # The validation images are those of the split without a test split: the test split comes out of training.
    assert DigitsDataset("validation", val_fraction=0.2).indices.tolist() == splits["validation"].indices.tolist()
    image, label = splits["train"][0]
    assert isinstance(image, Image.Image) and image.size == (8, 8) and image.mode == "RGB"
    assert np.asarray(image).max() == 255  # 0..16 scaled to the full 8-bit range
    again = DigitsDataset("test", val_fraction=0.2, test_fraction=0.2)
    assert again.indices.tolist() == splits["test"].indices.tolist()
    assert np.array_equal(np.asarray(again[5][0]), np.asarray(splits["test"][5][0]))


def test_deit_transforms_and_posterize_at_full_magnitude():
    """RandAugment m9-mstd0.5 reaches magnitude 10 ~2 % of the time, where timm asks Pillow to
    posterize to 0 bits; Pillow >= 12 raises there, old Pillow (DeiT's) gave a black image."""
    from timm.data.auto_augment import RandAugment

    train, evaluation = build_transforms(DEIT_AUG, img_size=16)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 24, 3), dtype=np.uint8))
    assert train(image).shape == evaluation(image).shape == (3, 16, 16)
    rand_augment = next(t for t in train.transforms if isinstance(t, RandAugment))
    posterize = next(op for op in rand_augment.ops if op.name == "PosterizeIncreasing")
    posterize.prob, posterize.magnitude, posterize.magnitude_std = 1.0, 10, 0.0
    assert np.asarray(posterize(image)).max() == 0
    posterize.magnitude = 5  # 2 bits kept: Pillow's own posterize
    assert set(np.unique(np.asarray(posterize(image)))) <= {0, 64, 128, 192}


class _Indices(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.rand(()), i  # the random value shows the augmentation draws


def _epoch(loader: TrainLoader, epoch: int, start: int = 0):
    torch.manual_seed(12345)  # the global RNG's state must not matter: each image seeds its own draws
    batches = list(loader.epoch(epoch, start=start))
    return torch.cat([b[1] for b in batches]).tolist(), torch.cat([b[0] for b in batches])


@pytest.mark.parametrize("num_workers", [0, 1])
def test_train_batches_are_a_function_of_seed_and_epoch(num_workers):
    def make(seed):
        return TrainLoader(
            _Indices(),
            batch_size=8,
            seed=seed,
            rank=0,
            world_size=1,
            repeated_aug=3,
            num_workers=num_workers,
            pin_memory=False,
        )

    loader = make(0)
    order, draws = _epoch(loader, 3)
    assert sorted(order) == list(range(40))
    _epoch(loader, 4)
    replay_order, replay_draws = _epoch(make(0), 3)  # a fresh loader, as after a resume
    assert replay_order == order and torch.equal(replay_draws, draws)
    assert _epoch(loader, 4)[0] != order and _epoch(make(1), 3)[0] != order


class _CountingIndices(_Indices):
    def __init__(self):
        self.loaded = []

    def __getitem__(self, i):
        self.loaded.append(i)
        return super().__getitem__(i)


def test_an_epoch_started_at_a_batch_is_the_rest_of_the_whole_epoch_and_loads_nothing_before():
    """What a run resumed mid-epoch relies on: same images in the same order, same augmentation
    draws, whatever the number of workers; the skipped batches are never loaded."""

    def make(dataset, num_workers):
        return TrainLoader(
            dataset,
            batch_size=8,
            seed=0,
            rank=0,
            world_size=1,
            repeated_aug=3,
            num_workers=num_workers,
            pin_memory=False,
        )

    order, draws = _epoch(make(_Indices(), 1), 2)
    assert len(make(_Indices(), 0)) == 5
    counting = _CountingIndices()
    rest_order, rest_draws = _epoch(make(counting, 0), 2, start=2)
    assert rest_order == order[16:] and torch.equal(rest_draws, draws[16:])
    assert counting.loaded == order[16:]
    assert list(make(_Indices(), 0).epoch(2, start=5)) == []  # all done: the epoch's end is next


def test_ddp_repeated_augmentation_and_sharded_validation():
    ranks = [
        TrainLoader(
            _Indices(), batch_size=4, seed=0, rank=r, world_size=2, repeated_aug=3, num_workers=0, pin_memory=False
        )
        for r in range(2)
    ]
    seen = [_epoch(loader, 0)[0] for loader in ranks]
    # timm's RepeatAugSampler: 3 copies of each image per epoch, spread over processes, of
    # which each process keeps len(dataset) / world_size.
    assert len(seen[0]) == len(seen[1]) == 20
    assert max(np.bincount(seen[0] + seen[1])) <= 3
    shards = [
        [
            i
            for _, idx in eval_loader(_Indices(), batch_size=7, rank=r, world_size=3, num_workers=0, pin_memory=False)
            for i in idx.tolist()
        ]
        for r in range(3)
    ]
    assert sorted(sum(shards, [])) == list(range(40))


def _corrupt_jpeg(path) -> None:
    """A real JPEG cut off after its first 200 bytes, as a failed copy leaves it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (64, 64), (10, 200, 30)).save(path, format="JPEG")
    path.write_bytes(path.read_bytes()[:200])


def test_a_corrupt_image_is_named_or_skipped_and_listed(imagenet_root, tmp_path):
    from horst_sparse.vit.data import CorruptImageError, build_datasets, skipped_images

    bad = imagenet_root / "train" / "n01443537" / "broken.JPEG"  # minival_size 1 holds out an image of the other class
    _corrupt_jpeg(bad)
    _png(imagenet_root / "train" / "n01440764" / "img1.png")
    data = {"name": "imagefolder", "root": str(imagenet_root), "skip_corrupt": False, "minival_size": 1}
    train = build_datasets(data, TINY_AUG, img_size=12).train
    index = [p for p, _ in train.samples].index(str(bad))
    with pytest.raises(CorruptImageError, match=f"{bad} cannot be read as an image .*data.skip_corrupt=true"):
        train[index]
    log = tmp_path / "skipped.txt"
    train = build_datasets({**data, "skip_corrupt": True}, TINY_AUG, img_size=12, skipped_log=log).train
    image, target = train[index]  # the next readable image of the folder, with its own label
    next_path, next_target = train.samples[(index + 1) % len(train.samples)]
    assert target == next_target and image.shape == (3, 12, 12)
    train[index]
    assert skipped_images(log) == [str(bad)]  # listed, counted once


def test_check_imagefolder_script_finds_every_unreadable_file(imagenet_root):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "check_imagefolder.py"
    scan = lambda: subprocess.run(
        [sys.executable, str(script), str(imagenet_root), "--workers", "2"],  # noqa: E731
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert scan().returncode == 0
    _corrupt_jpeg(imagenet_root / "val" / "n01443537" / "cut.JPEG")
    (imagenet_root / "train" / "n01440764" / "notes.JPEG").write_text("not an image")
    result = scan()
    assert result.returncode == 1
    assert "cut.JPEG: OSError" in result.stdout and "notes.JPEG: UnidentifiedImageError" in result.stdout
    assert "2 of 6 files cannot be read" in result.stdout


SLURM_SIGNALS_EVERY_PROCESS = """
import os, signal, sys, time
import multiprocessing
import torch
from torch.utils.data import TensorDataset
from horst_sparse.training.preemption import PreemptionGuard
from horst_sparse.vit.data import TrainLoader, eval_loader

if __name__ == "__main__":
    multiprocessing.set_start_method(sys.argv[1], force=True)
    data = TensorDataset(torch.arange(32.0))
    train = TrainLoader(data, batch_size=4, seed=0, rank=0, world_size=1, repeated_aug=1, num_workers=2,
                        pin_memory=False)
    guard = PreemptionGuard()
    seen = []
    for epoch in range(2):
        for batch, (x,) in enumerate(train.epoch(epoch)):
            seen += x.tolist()
            if epoch == 0 and batch == 1:
                os.killpg(0, signal.SIGUSR2)  # what SLURM does: every process of the job
                time.sleep(0.5)
    seen += [v for (x,) in eval_loader(data, batch_size=8, rank=0, world_size=1, num_workers=2, pin_memory=False)
             for v in x.tolist()]
    print(len(seen), guard.requested())
"""


def test_loader_workers_leave_the_preemption_signal_to_the_trainer(tmp_path):
    """SLURM's SIGUSR2 reaches every process of the job. Workers started by forkserver
    (Python 3.14's default on Linux; spawn is the same case) would die of it and fail the
    epoch before the checkpoint; they start with it blocked, and the training process
    records it."""
    script = tmp_path / "job.py"
    script.write_text(SLURM_SIGNALS_EVERY_PROCESS)
    done = subprocess.run(
        [sys.executable, str(script), "forkserver"],
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["96", "True"]  # two whole epochs and the validation pass; the signal recorded


# ---- splits: ImageNet's minival, MNIST-1D, eval_split ----------------------------------------


def _imagefolder(root, order=1) -> None:
    """3 classes x 5 training images, 2 validation images each; `order` -1 writes them reversed."""
    files = [
        (split, c, i)
        for split, count in (("train", 5), ("val", 2))
        for c in ("n01", "n02", "n03")
        for i in range(count)
    ]
    for split, c, i in files[::order]:
        _png(root / split / c / f"{c}_{i}.png", color=(40 * i, 80, 120))


def test_minival_is_a_fixed_list_of_training_images_and_test_is_val(tmp_path):
    from horst_sparse.vit.data import build_datasets

    _imagefolder(tmp_path / "a")
    _imagefolder(tmp_path / "b", order=-1)  # another copy, written in another order
    data = {"name": "imagefolder", "skip_corrupt": False, "minival_size": 4}
    a = build_datasets({**data, "root": str(tmp_path / "a")}, TINY_AUG, img_size=12, eval_split="test")
    b = build_datasets({**data, "root": str(tmp_path / "b")}, TINY_AUG, img_size=12)
    # 4 over 3 classes: 2, 1, 1; in each class the smallest SHA-256 of "<class>/<file>". Fixed: a change is a new split.
    assert a.minival == b.minival == ["n01/n01_1.png", "n01/n01_2.png", "n02/n02_3.png", "n03/n03_1.png"]
    train = {Path(p).relative_to(tmp_path / "a" / "train").as_posix() for p, _ in a.train.samples}
    assert len(train) == 11 and not train & set(a.minival) and len(train | set(a.minival)) == 15
    assert [t for _, t in a.val.samples] == [0, 0, 1, 2] and a.val[0][0].shape == (3, 12, 12)
    assert a.test is not None and sorted(Path(p).parent.parent.name for p, _ in a.test.samples) == ["val"] * 6
    assert b.test is None  # eval_split validation: the test images are not even listed
    listed = tmp_path / "minival.txt"  # what a user records before a job: the same list
    script = [sys.executable, str(REPO / "scripts" / "check_imagefolder.py"), str(tmp_path / "a"), "--workers", "1"]
    done = subprocess.run(
        [*script, "--minival-list", str(listed), "--minival-size", "4"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert listed.read_text().splitlines() == a.minival
    with pytest.raises(
        DataLayoutError, match=r"data.minival_size=15 holds out 5 training images of class 0, which has only 5"
    ):
        build_datasets({**data, "root": str(tmp_path / "a"), "minival_size": 15}, TINY_AUG, img_size=12)


def test_a_split_the_data_does_not_have_is_one_line():
    from horst_sparse.vit.data import build_datasets

    digits = {"name": "digits", "val_fraction": 0.2, "test_fraction": None}
    with pytest.raises(DataLayoutError, match="eval_split=test, but data.name=digits has no test split") as error:
        build_datasets(digits, TINY_AUG, img_size=8, eval_split="test")
    assert "\n" not in str(error.value)
    assert build_datasets(digits, TINY_AUG, img_size=8).test is None


def test_mnist1d_is_generated_offline_with_the_published_defaults_split_and_cached(tmp_path, monkeypatch):
    import requests
    from mnist1d.data import get_dataset_args

    from horst_sparse.vit.data import Mnist1DDataset, mnist1d_examples

    def no_download(*args, **kwargs):
        raise AssertionError("MNIST-1D must be generated, never downloaded")

    monkeypatch.setattr(requests, "get", no_download)
    numpy_state = np.random.get_state()[1].copy()
    x, y = mnist1d_examples(600, cache=str(tmp_path))
    assert np.array_equal(np.random.get_state()[1], numpy_state)  # the global RNG is left as it was
    assert x.shape == (600, 40) and x.dtype == np.float32 and np.bincount(y).tolist() == [60] * 10
    (cached,) = tmp_path.glob("mnist1d_600_*.npz")
    stored = np.load(cached)
    args = {**get_dataset_args(as_dict=True), "num_samples": 600}
    del args["url"]
    assert json.loads(str(stored["args"])) == args  # the published defaults, but the size
    mnist1d_examples.cache_clear()
    again = mnist1d_examples(600, cache=str(tmp_path))  # read from the cache: the same examples
    assert np.array_equal(again[0], x) and np.array_equal(again[1], y)

    splits = {
        s: Mnist1DDataset(s, num_samples=600, val_fraction=0.1, test_fraction=0.5, cache=str(tmp_path))
        for s in ("train", "validation", "test")
    }
    assert [len(d) for d in splits.values()] == [240, 60, 300]
    indices = [set(d.indices.tolist()) for d in splits.values()]
    assert set.union(*indices) == set(range(600)) and sum(map(len, indices)) == 600
    assert all(np.bincount(d.targets).tolist() == [len(d) // 10] * 10 for d in splits.values())  # stratified
    inputs, label = splits["test"][3]
    assert inputs.shape == (1, 1, 40) and torch.equal(inputs[0, 0], torch.from_numpy(x[splits["test"].indices[3]]))
    assert label == y[splits["test"].indices[3]]


def test_a_tiny_mnist1d_run_reports_on_the_split_eval_split_says(tmp_path):
    """End to end through timm's ViT with (1, p) patches and AC/DC: the summary's top-1 is the
    final model's on the test split, every epoch's on validation."""
    from horst_sparse.compose import compose
    from horst_sparse.pipeline import get
    from horst_sparse.training.checkpoint import latest_checkpoint, load_checkpoint
    from horst_sparse.vit.data import Mnist1DDataset
    from horst_sparse.vit.model import build_model, evaluate
    from horst_sparse.vit.run import run

    overrides = [
        "vit_recipe=mnist1d",
        f"data.root={tmp_path / 'cache'}",
        "data.num_samples=300",
        "eval_split=test",
        "model.embed_dim=16",
        "model.depth=1",
        "model.num_heads=2",
        "train.batch_size=40",
        "train.base_batch_size=40",
        "train.epochs=5",
        "train.warmup_epochs=1",
        "acdc.dense_warmup=1",
        "acdc.compressed=2",
        "acdc.decompressed=1",
        "acdc.final_decompressed=1",
        "acdc.final_compressed=1",
        "acdc.sparsity=0.8",
        "logging.mode=disabled",
        "device=cpu",
    ]
    cfg = compose(get("vit"), overrides)
    summary = run(cfg, run_dir=tmp_path / "run")
    assert summary["eval_split"] == "test" and summary["model"]["patch_size"] == [1, 8]
    assert (summary["data"]["train_images"], summary["data"]["val_images"], summary["data"]["test_images"]) == (
        120,
        30,
        150,
    )
    assert summary["accuracy_unit"] == "fraction of the 150 test images" and summary[
        "measured_sparsity"
    ] == pytest.approx(0.8, abs=1e-3)

    model = build_model(cfg.model, num_classes=10, in_chans=1)
    model.load_state_dict(load_checkpoint(latest_checkpoint(tmp_path / "run"))["model"])
    split = dict(num_samples=300, val_fraction=0.1, test_fraction=0.5, cache=str(tmp_path / "cache"))
    on = {
        s: evaluate(
            model,
            eval_loader(
                Mnist1DDataset(s, **split), batch_size=64, rank=0, world_size=1, num_workers=0, pin_memory=False
            ),
            device=torch.device("cpu"),
            dtype=torch.float32,
        )
        for s in ("validation", "test")
    }
    assert (summary["top1"], summary["top5"]) == pytest.approx((on["test"]["top1"], on["test"]["top5"]))
    assert summary["epochs"][-1]["top1"] == pytest.approx(on["validation"]["top1"])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["test/top1"] for r in records if "test/top1" in r] == [summary["top1"]]


# ---- the file list cache and the loaders' workers ----------------------------------------------


def _settle(folder: Path) -> None:
    """Every directory under `folder` an hour old, past `RACY_MTIME_S`: its listing may be cached."""
    old = time.time() - 3600
    for directory in [folder, *[p for p in folder.rglob("*") if p.is_dir()]]:
        os.utime(directory, (old, old))


def test_the_file_list_is_torchvisions_and_cached_until_a_folder_changes(tmp_path, monkeypatch):
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    from horst_sparse.vit import data

    folder = tmp_path / "train"
    for name in ("b/x2.JPEG", "b/x10.png", "b/notes.txt", "a/sub/z.jpg", "a/sub/deeper/y.jpg", "a/a.JPG", "a/sub.jpg"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"")
    (folder / "a" / "linked").symlink_to(folder / "b", target_is_directory=True)  # followed, as torchvision does
    _settle(folder)
    classes = ["a", "b"]
    expected = make_dataset(str(folder), {"a": 0, "b": 1}, extensions=IMG_EXTENSIONS)
    assert data.image_files(folder, classes, IMG_EXTENSIONS) == expected
    beside, _ = data.file_list_paths(folder)
    assert beside == tmp_path / ".train.files.json" and beside.is_file()

    def no_scan(*args):
        raise AssertionError("listed again")

    with monkeypatch.context() as patch:
        patch.setattr(data, "_scan", no_scan)
        assert data.image_files(folder, classes, IMG_EXTENSIONS) == expected  # from the cache

    (folder / "a" / "sub" / "deeper" / "new.png").write_bytes(b"")  # a change two folders down
    expected = make_dataset(str(folder), {"a": 0, "b": 1}, extensions=IMG_EXTENSIONS)
    assert data.image_files(folder, classes, IMG_EXTENSIONS) == expected and len(expected) == 9
    # Just changed: listed, not cached (a change within the mtime's resolution would go unseen).
    assert "new.png" not in beside.read_text()
    _settle(folder)
    assert data.image_files(folder, classes, IMG_EXTENSIONS) == expected and "new.png" in beside.read_text()


def test_a_read_only_data_folder_caches_its_file_list_under_the_user_cache(tmp_path, monkeypatch, capsys):
    from torchvision.datasets.folder import IMG_EXTENSIONS

    from horst_sparse.vit import data

    folder = tmp_path / "data" / "train"
    _png(folder / "c" / "i.png")
    _settle(folder)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    beside, fallback = data.file_list_paths(folder)
    assert fallback.parent == tmp_path / "cache" / "horst_sparse" / "file_lists"
    monkeypatch.setattr(data, "file_list_paths", lambda f: (Path("/proc/no/such/list.json"), fallback))  # unwritable
    assert data.image_files(folder, ["c"], IMG_EXTENSIONS) == [(str(folder / "c" / "i.png"), 0)]
    assert fallback.is_file() and f"the file list of {folder} is cached at {fallback}" in capsys.readouterr().err


def test_under_ddp_rank_zero_writes_the_file_list_and_the_others_read_it(tmp_path, monkeypatch):
    from torchvision.datasets.folder import IMG_EXTENSIONS

    import horst_sparse.training.distributed as distributed
    from horst_sparse.vit import data

    folder = tmp_path / "train"
    _png(folder / "c" / "i.png")
    _settle(folder)
    beside, _ = data.file_list_paths(folder)
    events = []
    monkeypatch.setattr(distributed, "barrier", lambda: events.append(("barrier", beside.is_file())))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    data.image_files(folder, ["c"], IMG_EXTENSIONS)
    assert events == [("barrier", True)]  # rank 0 lists and writes, then releases the others

    events.clear()
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(data, "_scan", lambda *a: events.append("listed"))
    assert data.image_files(folder, ["c"], IMG_EXTENSIONS) == [(str(folder / "c" / "i.png"), 0)]
    assert events == [("barrier", True)]  # waits for rank 0, then reads, lists nothing


class _Pid(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        return os.getpid()


def test_loader_workers_persist_across_epochs_and_evaluations():
    from horst_sparse.vit.data import PREFETCH_FACTOR

    train = TrainLoader(
        _Pid(), batch_size=2, seed=0, rank=0, world_size=1, repeated_aug=1, num_workers=2, pin_memory=False
    )
    val = eval_loader(_Pid(), batch_size=2, rank=0, world_size=1, num_workers=2, pin_memory=False)
    pids = lambda loader: set(torch.cat(list(loader)).tolist())  # noqa: E731
    first = pids(train.epoch(0))
    assert len(first) == 2 and pids(train.epoch(1)) == first and pids(train.epoch(2, start=2)) == first
    assert pids(val) == pids(val) and not pids(val) & first
    assert train.loader.prefetch_factor == val.prefetch_factor == PREFETCH_FACTOR
    in_process = eval_loader(_Pid(), batch_size=2, rank=0, world_size=1, num_workers=0, pin_memory=False)
    assert not in_process.persistent_workers and pids(in_process) == {os.getpid()}
