"""Data for the ViT pipeline: ImageNet as an ImageFolder root or scikit-learn's digits, both
through the same timm transforms, samplers, loaders and Mixup/CutMix; and MNIST-1D as 1 x 40
one-channel images (generated offline, no transform). Every dataset has fixed train /
validation / test splits (`build_datasets`): ImageNet's validation is a minival held out of
`train/`, its test the official `val/`.

The DeiT recipe (Touvron et al., "Training data-efficient image transformers & distillation
through attention", ICML 2021; docs/design.md §4) is assembled from timm's own pieces:
`create_transform` (RandAugment, random erasing), `Mixup` with label smoothing and
`SoftTargetCrossEntropy`, and `RepeatAugSampler` (repeated augmentation) under DDP.

Every epoch's randomness is derived from (seed, epoch, rank) by `epoch_seed`: the data order,
and a seed for each image of the epoch that its augmentation draws from, in whichever worker
loads it. So a resumed run or a DDP run draws exactly what an uninterrupted run draws, without
depending on saved RNG state, and a run resumed mid-epoch skips the done batches unloaded.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

from horst_sparse.training.config import RunError
from horst_sparse.training.preemption import signal_blocked

IMAGENET_LAYOUT = (
    "expected an ImageNet-style ImageFolder root: <root>/train/<class>/<image> and "
    "<root>/val/<class>/<image>, with the same class folders in both"
)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class CorruptImageError(RunError):
    """An image file that cannot be decoded; the message names it and the fixes."""


class DataLayoutError(RunError):
    """A data root that cannot be read as the configured dataset; one line, with the fix."""


def epoch_seed(seed: int, epoch: int, *streams: int) -> int:
    """A well-mixed 32-bit seed (numpy's limit) for one epoch and, optionally, one rank."""
    return int(np.random.SeedSequence([seed, epoch, *streams]).generate_state(1)[0])


# ---- datasets ------------------------------------------------------------------------------

SPLITS = ("train", "validation", "test")  # validation: monitoring and tuning; test: the reported numbers
SPLIT_SEED = 0  # of every fixed split: the same data for every run seed


def stratified_splits(
    targets: np.ndarray, *, val_fraction: float, test_fraction: float | None
) -> dict[str, np.ndarray]:
    """Indices of a fixed stratified train / validation / test split (independent of the run's
    seed: seeds vary the training, not the data). Validation is drawn first, the test split
    from the rest, so a test split leaves the validation images as they were without one."""
    from sklearn.model_selection import train_test_split

    everything = np.arange(len(targets))
    rest, validation = train_test_split(everything, test_size=val_fraction, stratify=targets, random_state=SPLIT_SEED)
    test = np.array([], dtype=np.int64)
    if test_fraction:
        rest, test = train_test_split(
            rest, test_size=round(test_fraction * len(targets)), stratify=targets[rest], random_state=SPLIT_SEED
        )
    return {"train": rest, "validation": validation, "test": test}


class DigitsDataset(Dataset):
    """scikit-learn's bundled 8x8 digits (1797 images, 10 classes) as RGB PIL images, so they
    go through the same timm transforms as ImageNet, split by `stratified_splits`."""

    def __init__(
        self, split: str, *, val_fraction: float, test_fraction: float | None = None, transform: Callable | None = None
    ) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        pixels = (digits.images * (255.0 / 16.0)).round().astype(np.uint8)  # 0..16 -> 0..255
        indices = stratified_splits(digits.target, val_fraction=val_fraction, test_fraction=test_fraction)[split]
        self.indices = indices
        self.images = [Image.fromarray(pixels[i]).convert("RGB") for i in indices]
        self.targets = [int(digits.target[i]) for i in indices]
        self.classes = [str(c) for c in digits.target_names]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        image = self.images[index]
        return (self.transform(image) if self.transform else image), self.targets[index]


@functools.cache  # one generation (or read) for the three splits of a run
def mnist1d_examples(num_samples: int, *, cache: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`(x [n, 40] float32, y [n])`: MNIST-1D (Greydanus & Steinbach, "Scaling down deep
    learning with MNIST-1D", ICML 2024) generated by the package's `make_dataset` with its
    published defaults (`get_dataset_args()`) but `num_samples` examples; never its download.
    Its own train/test cut is undone: `stratified_splits` makes ours. Generating 10,000 takes
    ~15 s of CPU, so with `cache` (a folder) the examples are kept there on first use, in a
    file named by every generation argument. `make_dataset` reseeds python's and numpy's global
    RNGs; their states are put back."""
    from mnist1d.data import get_dataset_args, make_dataset
    from mnist1d.utils import ObjectView

    args = get_dataset_args(as_dict=True)
    args.pop("url")  # the download's: never used
    args["num_samples"] = num_samples
    name = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]
    path = Path(cache).expanduser() / f"mnist1d_{num_samples}_{name}.npz" if cache else None
    if path is not None and path.is_file():
        stored = np.load(path)
        return stored["x"], stored["y"]
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        made = make_dataset(ObjectView(dict(args)))
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
    x = np.concatenate([made["x"], made["x_test"]]).astype(np.float32)
    y = np.concatenate([made["y"], made["y_test"]]).astype(np.int64)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")  # runs side by side may generate it at once
        np.savez(tmp, x=x, y=y, args=json.dumps(args))
        os.replace(tmp, path)
    return x, y


class Mnist1DDataset(Dataset):
    """MNIST-1D as 1 x 40 one-channel images (`mnist1d_examples`), for a ViT with (1, p)
    patches. Its generator already shifts, scales, shears and adds noise to every example,
    so no image transform applies; items are `(tensor [1, 1, 40], label)`."""

    def __init__(
        self,
        split: str,
        *,
        num_samples: int,
        val_fraction: float,
        test_fraction: float | None,
        cache: str | None = None,
    ) -> None:
        x, y = mnist1d_examples(num_samples, cache=cache)
        self.indices = stratified_splits(y, val_fraction=val_fraction, test_fraction=test_fraction)[split]
        self.inputs = torch.from_numpy(x[self.indices]).view(-1, 1, 1, x.shape[1])
        self.targets = y[self.indices].tolist()
        self.labels = torch.from_numpy(y[self.indices])  # `targets` as one tensor: for `batch`
        self.classes = [str(c) for c in range(10)]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.inputs[index], self.targets[index]

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The items at `indices` as one batch by indexing: what the DataLoader collates from
        them one by one, bit for bit (no transform draws from any generator)."""
        return self.inputs[indices], self.labels[indices]


def check_imagefolder_root(root: str | None) -> list[str]:
    """The class names of an ImageNet-layout root, or a one-line `DataLayoutError`."""
    if not root:
        raise DataLayoutError(f"data.root is not set; pass data.root=/path/to/imagenet ({IMAGENET_LAYOUT})")
    root_path = Path(root).expanduser()
    if not root_path.is_dir():
        raise DataLayoutError(f"data.root={root} does not exist or is not a folder; {IMAGENET_LAYOUT}")
    classes = {}
    for split in ("train", "val"):
        folder = root_path / split
        if not folder.is_dir():
            raise DataLayoutError(f"data.root={root} has no {split}/ folder; {IMAGENET_LAYOUT}")
        classes[split] = sorted(d.name for d in folder.iterdir() if d.is_dir())
        if not classes[split]:
            loose = sum(1 for f in folder.iterdir() if f.suffix.lower() in IMAGE_EXTENSIONS)
            hint = (
                f" ({loose} images lie directly in it: sort them into one folder per class; "
                "scripts/prepare_imagenet.py does so from the official archives)"
                if loose
                else ""
            )
            raise DataLayoutError(f"data.root={root}: {split}/ has no class folders{hint}; {IMAGENET_LAYOUT}")
    if classes["train"] != classes["val"]:
        only_train = sorted(set(classes["train"]) - set(classes["val"]))[:3]
        only_val = sorted(set(classes["val"]) - set(classes["train"]))[:3]
        raise DataLayoutError(
            f"data.root={root}: train/ has {len(classes['train'])} class folders and val/ {len(classes['val'])}, "
            f"not the same ones (only in train: {only_train}, only in val: {only_val}); {IMAGENET_LAYOUT}"
        )
    return classes["train"]


def read_image(path: str) -> Image.Image:
    """The image at `path` as RGB, fully decoded (a truncated file fails here, not later)."""
    with open(path, "rb") as f:
        image = Image.open(f)
        image.load()
        return image.convert("RGB")


# ---- the file list of an ImageFolder, cached ------------------------------------------------

FILE_LIST_VERSION = 1  # of the cache's layout; another version is scanned again
# A directory changed this recently may change again within its mtime's resolution (a second on
# some network file systems) unseen: a list with such a directory is used but not cached.
RACY_MTIME_S = 60


def _scan(folder: str, classes: list[str], extensions: tuple[str, ...]) -> tuple[dict, dict]:
    """`({class: [file relative to its class folder]}, {directory relative to folder: mtime_ns})`:
    torchvision's `make_dataset` listing (`os.walk` with `followlinks`, directories and then files
    in sorted order, files by extension), with the mtime of each directory taken before it is listed
    (a file added or removed after the listing changes a recorded mtime)."""
    from torchvision.datasets.folder import has_file_allowed_extension

    files, mtimes = {}, {}
    for name in classes:
        top, listed, todo = os.path.join(folder, name), [], [os.path.join(folder, name)]
        while todo:
            directory = todo.pop()
            mtimes[os.path.relpath(directory, folder)] = os.stat(directory).st_mtime_ns
            with os.scandir(directory) as scan:
                entries = list(scan)
            todo += [e.path for e in entries if e.is_dir()]
            listed.append((directory, sorted(e.name for e in entries if not e.is_dir())))
        files[name] = [
            os.path.relpath(os.path.join(directory, f), top)
            for directory, names in sorted(listed)
            for f in names
            if has_file_allowed_extension(f, extensions)
        ]
    return files, mtimes


def file_list_paths(folder: Path) -> tuple[Path, Path]:
    """Where the file list of `folder` is cached: next to it (`<root>/.<split>.files.json`) or,
    where that cannot be written, under the user's cache folder."""
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()
    key = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    return folder.parent / f".{folder.name}.files.json", cache_home / "horst_sparse" / "file_lists" / f"{key}.json"


def _cached_files(path: Path, folder: str, classes: list[str], extensions: tuple[str, ...]) -> dict | None:
    """The cached lists at `path` while every directory they were listed from is unchanged."""
    try:
        record = json.loads(path.read_text())
        unchanged = all(os.stat(os.path.join(folder, d)).st_mtime_ns == t for d, t in record["mtimes"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none, unreadable, or another layout
        return None
    if record.get("version") != FILE_LIST_VERSION or record.get("extensions") != list(extensions):
        return None
    return record["files"] if unchanged and record.get("classes") == classes else None


def _write_file_list(folder: Path, record: dict) -> None:
    """Atomically, next to `folder` or else (a read-only data folder) under the user's cache."""
    beside, fallback = file_list_paths(folder)
    for path in (beside, fallback):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            try:
                tmp.write_text(json.dumps(record))
                os.replace(tmp, path)  # readers see the old file or the whole new one
            finally:
                tmp.unlink(missing_ok=True)
        except OSError:
            continue
        if path == fallback:
            print(f"{beside.parent} is not writable: the file list of {folder} is cached at {path}", file=sys.stderr)
        return


def image_files(folder: Path, classes: list[str], extensions: tuple[str, ...]) -> list[tuple[str, int]]:
    """torchvision's `(path, class index)` list of the ImageFolder `folder`, from the cache of
    `file_list_paths` when no directory of it changed since (ImageNet's 1.28M files are listed
    in minutes on a network file system, by every process at every start and requeue
    otherwise). Under DDP rank 0 reads or lists and writes it while the others wait, then they
    read it. A class without images is torchvision's FileNotFoundError."""
    from horst_sparse.training.distributed import barrier

    first = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    if not first:
        barrier()  # rank 0's, below: the list is written
    root = str(folder)
    try:
        files = next((f for p in file_list_paths(folder) if (f := _cached_files(p, root, classes, extensions))), None)
        if files is None:
            files, mtimes = _scan(root, classes, extensions)
            empty = [name for name in classes if not files[name]]
            if empty:
                raise FileNotFoundError(
                    f"Found no valid file for the classes {', '.join(empty)}. Supported extensions are: "
                    f"{', '.join(extensions)}"
                )
            settled = time.time_ns() - max(mtimes.values()) > RACY_MTIME_S * 10**9
            if first and settled:
                record = {"version": FILE_LIST_VERSION, "extensions": list(extensions), "classes": classes}
                _write_file_list(folder, {**record, "mtimes": mtimes, "files": files})
    finally:
        if first:
            barrier()  # also when rank 0 failed: the others then list the folder and fail alike
    return [(os.path.join(root, name, f), index) for index, name in enumerate(classes) for f in files[name]]


def _image_folder(folder: Path, transform: Callable, *, skip_corrupt: bool, skipped_log: Path | None):
    from torchvision.datasets import ImageFolder

    class CheckedImageFolder(ImageFolder):
        """torchvision's ImageFolder whose file list is cached (`image_files`), and whose
        unreadable images are named in the error or, with `data.skip_corrupt=true`, replaced by
        the next readable image of the folder (so the batch keeps its size and a resumed run
        skips the same files) and listed in `skipped_log`, one path a line."""

        @staticmethod
        def make_dataset(directory, class_to_idx, extensions=None, is_valid_file=None, allow_empty=False):
            classes = sorted(class_to_idx, key=class_to_idx.get)
            return image_files(Path(directory), classes, extensions)

        def __getitem__(self, index: int):
            for offset in range(len(self.samples)):
                path, target = self.samples[(index + offset) % len(self.samples)]
                try:
                    image = read_image(path)
                except (OSError, SyntaxError, ValueError) as error:  # what Pillow raises for bad files
                    if not skip_corrupt:
                        raise CorruptImageError(
                            f"{path} cannot be read as an image ({type(error).__name__}: {error}); remove or replace "
                            "it, or set data.skip_corrupt=true to skip such files; scripts/check_imagefolder.py "
                            "finds them all before a job starts"
                        ) from None
                    if skipped_log is not None:
                        with open(skipped_log, "a") as log:  # one short append per file: safe from many workers
                            log.write(f"{path}\n")
                    continue
                return (self.transform(image) if self.transform else image), target
            raise CorruptImageError(f"{folder}: no image in it can be read")

    try:
        return CheckedImageFolder(str(folder), transform=transform)
    except FileNotFoundError as error:  # a class folder without any image
        raise DataLayoutError(f"{folder}: {str(error).splitlines()[0]}; {IMAGENET_LAYOUT}") from None


def skipped_images(skipped_log: Path) -> list[str]:
    """The distinct files `data.skip_corrupt` skipped, as listed in `skipped_log`."""
    return sorted(set(skipped_log.read_text().splitlines())) if skipped_log.exists() else []


def minival_indices(samples: list[tuple[str, int]], folder: Path, *, size: int) -> list[int]:
    """The held-out minival of an ImageFolder's training images, as indices into `samples`
    (torchvision's `(path, class)` list of `folder`): `size` images, spread evenly over the
    classes (the first `size % classes` classes one more), in each class those whose path
    relative to `folder` ("<class>/<file>") has the smallest SHA-256. A function of the file
    names alone: the same list on every machine and copy of the data, whatever its root or
    listing order (AlgoPerf's ImageNet workload also tunes on held-out training images and
    reports on the official validation set)."""
    by_class: dict[int, list[tuple[str, int]]] = {}
    for index, (path, target) in enumerate(samples):
        name = Path(path).relative_to(folder).as_posix()
        by_class.setdefault(target, []).append((hashlib.sha256(name.encode()).hexdigest(), index))
    quota, extra = divmod(size, len(by_class))
    held = []
    for rank, target in enumerate(sorted(by_class)):
        count, images = quota + (rank < extra), sorted(by_class[target])
        if count >= len(images):
            raise DataLayoutError(
                f"data.minival_size={size} holds out {count} training images of class {target}, which has only "
                f"{len(images)}: lower data.minival_size (ImageNet: 10000, 10 per class)"
            )
        held += [index for _, index in images[:count]]
    return sorted(held)


def _with_samples(folder_dataset, indices: list[int], transform: Callable | None):
    """A copy of an ImageFolder holding only `samples[indices]`, with its own transform."""
    subset = copy.copy(folder_dataset)
    subset.samples = [folder_dataset.samples[i] for i in indices]
    subset.imgs, subset.targets = subset.samples, [t for _, t in subset.samples]
    subset.transform = transform
    return subset


@dataclasses.dataclass
class ImageData:
    """A run's datasets. `test` is built only for a run that reports on it (`eval_split:
    test`); `sources` says what each split is, `minival` lists the training images an
    ImageFolder's validation split holds out (paths relative to `<root>/train`)."""

    train: Dataset
    val: Dataset
    test: Dataset | None
    classes: list[str]
    sources: dict[str, str]
    in_chans: int = 3
    minival: list[str] | None = None

    def split(self, name: str) -> Dataset:
        return {"validation": self.val, "test": self.test}[name]


def build_datasets(
    data: Mapping[str, Any],
    aug: Mapping[str, Any],
    *,
    img_size: int,
    eval_split: str = "validation",
    skipped_log: Path | None = None,
) -> ImageData:
    """The train, validation and (with `eval_split="test"`) test sets of `data.name`:
    digits or mnist1d (fixed stratified splits, `stratified_splits`), or an ImageFolder root
    (validation: the minival held out of `train/`, `minival_indices`; test: `val/`, the
    official validation set). Images go through timm's transforms (`build_transforms`);
    MNIST-1D through none. A split the data does not have is a one-line `DataLayoutError`."""
    name, with_test = data["name"], eval_split == "test"
    if name in ("digits", "mnist1d"):
        if with_test and not data["test_fraction"]:
            raise DataLayoutError(
                f"eval_split=test, but data.name={name} has no test split with data.test_fraction="
                f"{data['test_fraction']}; set data.test_fraction (the recipe's: 0.2 for digits) or eval_split=validation"
            )
        fractions = dict(val_fraction=data["val_fraction"], test_fraction=data["test_fraction"])
        if name == "mnist1d":
            make = functools.partial(Mnist1DDataset, num_samples=data["num_samples"], cache=data["root"], **fractions)
            splits = {split: make(split) for split in SPLITS if split != "test" or with_test}
            in_chans = 1
        else:
            train_transform, eval_transform = build_transforms(aug, img_size=img_size)
            transforms = {"train": train_transform, "validation": eval_transform, "test": eval_transform}
            splits = {
                s: DigitsDataset(s, transform=transforms[s], **fractions) for s in SPLITS if s != "test" or with_test
            }
            in_chans = 3
        sources = {
            split: f"{len(dataset)} of the {name} examples (fixed stratified split)"
            for split, dataset in splits.items()
        }
        return ImageData(
            splits["train"], splits["validation"], splits.get("test"), splits["train"].classes, sources, in_chans
        )

    classes = check_imagefolder_root(data["root"])
    root = Path(data["root"]).expanduser()
    skip = bool(data.get("skip_corrupt", False))
    train_transform, eval_transform = build_transforms(aug, img_size=img_size)
    full_train = _image_folder(root / "train", None, skip_corrupt=skip, skipped_log=skipped_log)
    held = minival_indices(full_train.samples, root / "train", size=data["minival_size"])
    held_set = set(held)
    train = _with_samples(full_train, [i for i in range(len(full_train.samples)) if i not in held_set], train_transform)
    validation = _with_samples(full_train, held, eval_transform)
    test = (
        _image_folder(root / "val", eval_transform, skip_corrupt=skip, skipped_log=skipped_log) if with_test else None
    )
    minival = [Path(p).relative_to(root / "train").as_posix() for p, _ in validation.samples]
    sources = {
        "train": f"train/ less the {len(held)} minival images",
        "validation": f"minival: {len(held)} images held out of train/ (minival.txt)",
        "test": "val/ (the official validation set)",
    }
    return ImageData(train, validation, test, classes, sources, minival=minival)


# ---- transforms ------------------------------------------------------------------------------


def _posterize(img: Image.Image, bits_to_keep: int, **_: Any) -> Image.Image:
    """timm's posterize, with 0 bits meaning a black image as in Pillow < 12 (which DeiT used).

    RandAugment `m9-mstd0.5` clips the magnitude at 10 about 2 % of the time, where timm asks
    Pillow for 0 bits; recent Pillow rejects that with a ValueError mid-epoch."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    from PIL import ImageOps

    return ImageOps.posterize(img, bits_to_keep)


def _patch_posterize(transform) -> None:
    from timm.data.auto_augment import RandAugment

    for t in getattr(transform, "transforms", []):
        if isinstance(t, RandAugment):
            for op in t.ops:
                if op.name.startswith("Posterize"):
                    op.aug_fn = _posterize


def build_transforms(aug: Mapping[str, Any], *, img_size: int):
    """timm's train transform (random resized crop, flip, RandAugment or colour jitter,
    normalisation, random erasing) and eval transform (resize, centre crop)."""
    from timm.data import create_transform

    train = create_transform(
        img_size,
        is_training=True,
        scale=tuple(aug["scale"]),
        hflip=aug["hflip"],
        color_jitter=aug["color_jitter"] or None,  # timm adds a no-op ColorJitter for 0
        auto_augment=aug["auto_augment"] or None,
        interpolation=aug["interpolation"],
        re_prob=aug["re_prob"],
        re_mode=aug["re_mode"],
        re_count=aug["re_count"],
    )
    _patch_posterize(train)
    evaluation = create_transform(
        img_size, is_training=False, interpolation=aug["interpolation"], crop_pct=aug["crop_pct"]
    )
    return train, evaluation


def build_mixup(aug: Mapping[str, Any], *, num_classes: int):
    """`(mixup_fn or None, train criterion)`: timm's Mixup/CutMix with label smoothing and
    SoftTargetCrossEntropy; without mixing, label-smoothed (or plain) cross-entropy."""
    from timm.data import Mixup
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    if aug["mixup"] > 0 or aug["cutmix"] > 0:
        mixup = Mixup(
            mixup_alpha=aug["mixup"],
            cutmix_alpha=aug["cutmix"],
            prob=aug["mixup_prob"],
            switch_prob=aug["mixup_switch_prob"],
            mode="batch",
            label_smoothing=aug["smoothing"],
            num_classes=num_classes,
        )
        return mixup, SoftTargetCrossEntropy()
    if aug["smoothing"] > 0:
        return None, LabelSmoothingCrossEntropy(smoothing=aug["smoothing"])
    return None, torch.nn.CrossEntropyLoss()


# ---- loaders ---------------------------------------------------------------------------------


class _Seeded(Dataset):
    """`dataset[index]` for an item `(index, seed)`, with python's, numpy's and torch's RNGs
    (the ones timm's transforms draw from) seeded first: an image's augmentation depends on
    its seed only, not on the worker that loads it nor on what that worker loaded before."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]):
        index, seed = item
        random.seed(seed)
        np.random.seed(seed)
        torch.default_generator.manual_seed(seed)  # CPU only: torch.manual_seed costs ~0.3 ms without CUDA
        return self.dataset[index]


class _Items(Sampler):
    """The items of one epoch, set by `TrainLoader.epoch`."""

    def __init__(self) -> None:
        self.items: list[tuple[int, int]] = []

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


# Batches each worker keeps ready (torch's default: 2). Decoding and RandAugment time varies
# from image to image; a deeper queue lets the step never wait on the slowest batch, at the cost
# of shared memory (a DeiT batch of 128 x 3 x 224 x 224 fp32 is 77 MB).
PREFETCH_FACTOR = 4


class _Loader(DataLoader):
    """A DataLoader whose worker processes leave SLURM's preemption signal to the training
    process: they start, on iteration, with it blocked (`horst_sparse.training.preemption.signal_blocked`).
    Workers persist from epoch to epoch and evaluation to evaluation (forked once, with their
    imports and the dataset), each `PREFETCH_FACTOR` batches ahead."""

    def __init__(self, dataset: Dataset, *, num_workers: int, **kwargs) -> None:
        if num_workers:
            kwargs.update(persistent_workers=True, prefetch_factor=PREFETCH_FACTOR)
        super().__init__(dataset, num_workers=num_workers, **kwargs)

    def __iter__(self):
        with signal_blocked():
            return super().__iter__()


class _Batches:
    """`in_memory_batches` of a whole data set in order, on every iteration."""

    def __init__(self, dataset: Dataset, batch_size: int) -> None:
        self.dataset, self.batch_size = dataset, batch_size

    def __iter__(self) -> Iterator:
        return in_memory_batches(self.dataset, torch.arange(len(self.dataset)), self.batch_size)


class TrainLoader:
    """Shuffled, drop-last batches of one process; `epoch(e, start=b)` returns the loader of
    epoch e from its batch b on.

    Order: single process, a random permutation drawn from (seed, epoch); DDP, timm's
    `RepeatAugSampler` (each image `repeated_aug` times per epoch, the copies on different
    processes; DeiT's repeated augmentation) or, with `repeated_aug <= 1`, a
    `DistributedSampler`. Augmentation: the i-th image of an epoch draws from a seed that is
    a function of (seed, epoch, rank, i), whatever the number of workers.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int,
        seed: int,
        rank: int,
        world_size: int,
        repeated_aug: int,
        num_workers: int,
        pin_memory: bool,
        in_memory: bool = False,
    ) -> None:
        from torch.utils.data import DistributedSampler

        self.dataset, self.batch_size, self.seed, self.rank = dataset, batch_size, seed, rank
        # engine=fast: a single process over a data set held as tensors indexes its batches (`in_memory_batches`)
        self.in_memory = in_memory and world_size == 1 and hasattr(dataset, "batch")
        self.order = None  # single process: a permutation per epoch
        if world_size > 1:
            if repeated_aug > 1:
                from timm.data.distributed_sampler import RepeatAugSampler

                self.order = RepeatAugSampler(dataset, num_replicas=world_size, rank=rank, num_repeats=repeated_aug)
            else:
                self.order = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
        self.samples = _Items()
        self.loader = _Loader(
            _Seeded(dataset),
            batch_size=batch_size,
            sampler=self.samples,
            drop_last=True,
            num_workers=num_workers,
            pin_memory=pin_memory,
        )
        self.batches_per_epoch = len(self.order if self.order is not None else dataset) // batch_size

    def __len__(self) -> int:
        return self.batches_per_epoch

    def epoch(self, epoch: int, *, start: int = 0) -> DataLoader:
        """Epoch `epoch`'s loader, from its batch `start` on (a run resumed mid-epoch): the
        batches before are not loaded, and the ones after are what they are in a whole epoch."""
        if self.order is None:
            shuffle = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
            order = torch.randperm(len(self.dataset), generator=shuffle)
            if self.in_memory:  # no transform: the per-image seeds below are never read
                return in_memory_batches(self.dataset, order[: len(self) * self.batch_size], self.batch_size, start)
            order = order.tolist()
        else:
            # The sampler's shuffle seed: the same on every process, different for every run seed.
            self.order.set_epoch(epoch_seed(self.seed, epoch))
            order = list(self.order)
        rng = torch.Generator().manual_seed(epoch_seed(self.seed, epoch, self.rank + 1))
        seeds = torch.randint(2**32, (len(order),), generator=rng).tolist()  # numpy's seeds are 32-bit
        self.samples.items = list(zip(order, seeds))[start * self.batch_size :]
        return self.loader


def in_memory_batches(dataset: Dataset, order: torch.Tensor, batch_size: int, start: int = 0) -> Iterator:
    """The batches of `dataset` (one with a `batch(indices)` method) in `order`, from batch `start` on."""
    return (dataset.batch(indices) for indices in order[start * batch_size :].split(batch_size))


def eval_loader(
    dataset: Dataset,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    num_workers: int,
    pin_memory: bool,
    in_memory: bool = False,
) -> Iterable:
    """Every validation image exactly once over all processes (strided shards, no padding);
    `in_memory` (engine=fast), a single process over a data set held as tensors: its batches by indexing."""
    if in_memory and world_size == 1 and hasattr(dataset, "batch"):
        return _Batches(dataset, batch_size)
    shard = Subset(dataset, range(rank, len(dataset), world_size)) if world_size > 1 else dataset
    return _Loader(shard, batch_size=batch_size, shuffle=False, num_workers=num_workers, pin_memory=pin_memory)
