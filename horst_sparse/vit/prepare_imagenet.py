"""ImageNet-1k from image-net.org's ILSVRC2012 archives to the ImageFolder root `train_vit.py
data.root=...` reads (`horst_sparse.vit.data.check_imagefolder_root`).

    python scripts/prepare_imagenet.py /path/to/downloads --out /path/to/imagenet
    python scripts/prepare_imagenet.py /path/to/downloads --out /path/to/imagenet --dry-run   # sizes and disk only

The folder holds the three official files (other paths: `--train`, `--val`, `--devkit`):

* `ILSVRC2012_img_train.tar`: one tar per class inside (`n01440764.tar`, ...), each the
  class's JPEGs; written to `train/<wnid>/`.
* `ILSVRC2012_img_val.tar`: the 50,000 validation images in one flat folder
  (`ILSVRC2012_val_00000001.JPEG`, ...); each goes to `val/<wnid>/` of its label.
* `ILSVRC2012_devkit_t12.tar.gz`: the labels. `data/ILSVRC2012_validation_ground_truth.txt`
  holds the class ID (1-1000) of each validation image, line n for image n, and
  `data/meta.mat` the WordNet id of each class ID (its `synsets`; the classes are the
  synsets without children), the format torchvision's `ImageNet` dataset reads too.

Resumable and idempotent: a class folder is extracted under `<out>/.partial/` and gets its
name in `train/` only when complete; `val/` is assembled there and moved into place last,
after every check, and `prepared.json` (the archives' sizes, the image counts) is written
with it. So a root with `val/` is complete, a rerun skips what is done and redoes only what
an interrupted run left, and a rerun of a prepared root changes nothing. Before any write the
bytes still to extract are compared with the free space of `--out`. Bad input (a missing or
foreign archive, labels that do not fit the images) is refused in one line naming the file.
`--verify` first checks each archive's MD5 against the published one (minutes per 100 GB).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tarfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from horst_sparse.training.config import RunError

TRAIN_ARCHIVE = "ILSVRC2012_img_train.tar"
VAL_ARCHIVE = "ILSVRC2012_img_val.tar"
DEVKIT_ARCHIVE = "ILSVRC2012_devkit_t12.tar.gz"
# The archives' MD5 sums as image-net.org publishes them (torchvision.datasets.imagenet.ARCHIVE_META
# lists the same three).
MD5 = {
    TRAIN_ARCHIVE: "1d675b47d978889d74fa0da5fadfb00e",
    VAL_ARCHIVE: "29b22e2961454d5413ddabcf34fc5622",
    DEVKIT_ARCHIVE: "fa75699e90414af021442c21a62c3abf",
}
GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
META = "data/meta.mat"
PARTIAL = ".partial"  # beside train/ and val/, never inside them: the loader reads every folder there as a class
PREPARED = "prepared.json"
CLASS_TAR = re.compile(r"^(n\d{8})\.tar$")
VAL_IMAGE = re.compile(r"^ILSVRC2012_val_(\d{8})\.JPEG$")


class ArchiveError(RunError):
    """An archive, a label file or an output folder that cannot be used; one line with the fix."""


@dataclass(frozen=True)
class ClassTar:
    wnid: str
    offset: int  # of its data inside the training archive
    size: int


@dataclass(frozen=True)
class Labels:
    wnids: list[str]  # the classes (synsets without children), by class ID
    val: dict[int, str]  # validation image number (1-based) -> its class's wnid


def gb(size: float) -> str:
    return f"{size / 1e9:,.1f} GB"


# ---- reading the archives ----------------------------------------------------------------------


def open_tar(path: Path, what: str, mode: str = "r:*") -> tarfile.TarFile:
    if not path.is_file():
        raise ArchiveError(
            f"{what} {path} does not exist: download it from image-net.org (ILSVRC2012) or pass its path"
        )
    try:
        return tarfile.open(path, mode)
    except (tarfile.TarError, OSError, EOFError) as error:
        raise ArchiveError(f"{what} {path} is not a readable tar archive ({error}): download it again") from None


def read_labels(devkit: Path) -> Labels:
    """The class of each validation image, from the devkit's ground truth and meta.mat."""
    import numpy as np
    import scipy.io

    with open_tar(devkit, "the devkit") as tar:
        found = {}
        for member in tar.getmembers():
            for wanted in (GROUND_TRUTH, META):
                if member.isfile() and member.name.endswith(wanted):
                    found[wanted] = tar.extractfile(member).read()
    missing = [name for name in (GROUND_TRUTH, META) if name not in found]
    if missing:
        raise ArchiveError(
            f"the devkit {devkit} has no {' or '.join(missing)}: it must be {DEVKIT_ARCHIVE} (the ILSVRC2012 task 1 devkit)"
        )
    try:
        synsets = np.atleast_1d(scipy.io.loadmat(io.BytesIO(found[META]), squeeze_me=True)["synsets"])
        leaves = {
            int(i): str(w)
            for i, w, c in zip(synsets["ILSVRC2012_ID"], synsets["WNID"], synsets["num_children"])
            if int(c) == 0
        }
    except (KeyError, ValueError, TypeError) as error:
        raise ArchiveError(
            f"the devkit's {META} has no readable synsets table ({error}): download the devkit again"
        ) from None
    try:
        ids = [int(line) for line in found[GROUND_TRUTH].decode().split()]
    except ValueError as error:
        raise ArchiveError(f"the devkit's {GROUND_TRUTH} is not one class ID a line ({error})") from None
    unknown = sorted(set(ids) - set(leaves))
    if unknown:
        raise ArchiveError(
            f"the devkit's {GROUND_TRUTH} names class IDs that {META} does not have ({unknown[:3]}): "
            "the two files are not of one devkit"
        )
    return Labels([leaves[i] for i in sorted(leaves)], {n: leaves[i] for n, i in enumerate(ids, start=1)})


def class_tars(train: Path) -> list[ClassTar]:
    """The per-class tars of the training archive, where their bytes lie (read from its headers only)."""
    with open_tar(train, "the training archive", "r:") as tar:  # uncompressed: the headers are read by seeking
        members = tar.getmembers()
    tars = []
    for member in members:
        match = CLASS_TAR.match(PurePosixPath(member.name).name)
        if not member.isfile() or not match:
            raise ArchiveError(
                f"the training archive {train} holds {member.name!r}, not a class tar (nXXXXXXXX.tar): "
                f"it must be {TRAIN_ARCHIVE}"
            )
        tars.append(ClassTar(match.group(1), member.offset_data, member.size))
    return tars


def val_members(val: Path, labels: Labels) -> list[tarfile.TarInfo]:
    with open_tar(val, "the validation archive", "r:") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
    if len(members) != len(labels.val):
        raise ArchiveError(
            f"the validation archive {val} holds {len(members)} images and the devkit's ground truth labels "
            f"{len(labels.val)}: they are not of one release"
        )
    for member in members:
        match = VAL_IMAGE.match(PurePosixPath(member.name).name)
        if not match or int(match.group(1)) not in labels.val:
            raise ArchiveError(
                f"the validation archive {val} holds {member.name!r}, which is no validation image of the devkit's "
                f"ground truth (ILSVRC2012_val_<1-{len(labels.val)}>.JPEG): it must be {VAL_ARCHIVE}"
            )
    return members


def verify_md5(path: Path) -> None:
    expected = MD5.get(path.name)
    if expected is None:
        raise ArchiveError(f"--verify: {path.name} is not an official archive's name ({', '.join(MD5)})")
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise ArchiveError(
            f"{path} has MD5 {digest.hexdigest()}, not the published {expected}: the download is damaged, download it again"
        )


# ---- writing the root --------------------------------------------------------------------------


class Window(io.RawIOBase):
    """`size` bytes of an open file from `offset`: one class tar inside the training archive."""

    def __init__(self, f, offset: int, size: int) -> None:
        f.seek(offset)
        self.f, self.left = f, size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.f.readinto(memoryview(buffer)[: min(len(buffer), self.left)])
        self.left -= n
        return n


def write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> None:
    """One image, under a temporary name until complete."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tar.extractfile(member) as source, open(tmp, "wb") as target:
        shutil.copyfileobj(source, target, 1 << 20)
    os.replace(tmp, path)


def extract_class(train: str, entry: ClassTar, out: str) -> int:
    """Extract one class tar into `<out>/.partial/train/<wnid>`, then rename it to
    `<out>/train/<wnid>`; returns its image count. Runs in a worker process."""
    staging, final = Path(out, PARTIAL, "train", entry.wnid), Path(out, "train", entry.wnid)
    shutil.rmtree(staging, ignore_errors=True)  # an interrupted run's: redone whole
    staging.mkdir(parents=True)
    count = 0
    with (
        open(train, "rb") as f,
        tarfile.open(fileobj=io.BufferedReader(Window(f, entry.offset, entry.size)), mode="r|") as tar,
    ):
        for member in tar:
            if member.isfile():
                write_member(tar, member, staging / PurePosixPath(member.name).name)
                count += 1
    if count == 0:
        raise ArchiveError(f"the class tar {entry.wnid}.tar of {train} holds no images: download the archive again")
    os.replace(staging, final)
    return count


def remaining_train(tars: list[ClassTar], out: Path) -> list[ClassTar]:
    return [t for t in tars if not (out / "train" / t.wnid).is_dir()]


def free_space(out: Path) -> int:
    """The free bytes where `out` is or would be made."""
    existing = next(p for p in (out, *out.parents) if p.exists())
    return shutil.disk_usage(existing).free


def check_free_space(out: Path, needed: int) -> None:
    free = free_space(out)
    if free < needed:
        raise ArchiveError(
            f"{out} has {gb(free)} free and the images still to extract need {gb(needed)}: "
            "free space there or pass another --out"
        )


def prepare(
    train: Path, val: Path, devkit: Path, out: Path, *, workers: int = 1, verify: bool = False, dry_run: bool = False
) -> dict:
    """Write `out` (train/<wnid>/, val/<wnid>/, prepared.json) from the three archives; returns
    what prepared.json records. Refuses bad input with an `ArchiveError` before writing."""
    from tqdm import tqdm

    from horst_sparse.vit.data import check_imagefolder_root

    out = out.expanduser()
    record_path = out / PREPARED
    if record_path.is_file() and (out / "val").is_dir():
        check_imagefolder_root(str(out))
        print(f"{out} is already prepared ({record_path}); delete it to prepare again")
        return json.loads(record_path.read_text())
    if (out / "val").exists():
        raise ArchiveError(
            f"{out / 'val'} exists but {out} has no {PREPARED}: it was not made by this command; "
            "move it away or pass another --out"
        )
    if verify:
        for path in (train, val, devkit):
            print(f"checking the MD5 of {path} ...")
            verify_md5(path)
    labels = read_labels(devkit)
    tars = class_tars(train)
    extra, absent = (
        sorted({t.wnid for t in tars} - set(labels.wnids)),
        sorted(set(labels.wnids) - {t.wnid for t in tars}),
    )
    if extra or absent:
        raise ArchiveError(
            f"the training archive {train} has {len(tars)} classes and the devkit {len(labels.wnids)}, not the same ones "
            f"(only in the archive: {extra[:3]}, only in the devkit: {absent[:3]}): they are not of one release"
        )
    images = val_members(val, labels)
    todo = remaining_train(tars, out)
    staged = out / PARTIAL / "val"
    val_todo = [m for m in images if not _staged(staged, labels, m)]
    needed = sum(t.size for t in todo) + sum(m.size for m in val_todo)
    print(
        f"{len(tars)} classes; {len(tars) - len(todo)} of them already in {out / 'train'}; "
        f"{len(images)} validation images, {len(images) - len(val_todo)} already staged; "
        f"{gb(needed)} still to write to {out}"
    )
    check_free_space(out, needed)
    if dry_run:
        print(f"dry run: nothing written; {gb(free_space(out))} free at {out}")
        return {}

    (out / "train").mkdir(parents=True, exist_ok=True)
    counts = {}
    if todo:
        with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
            futures = {pool.submit(extract_class, str(train), t, str(out)): t for t in todo}
            for future in tqdm(as_completed(futures), total=len(futures), desc="train classes", unit="class"):
                counts[futures[future].wnid] = future.result()

    for wnid in set(labels.val.values()):
        (staged / wnid).mkdir(parents=True, exist_ok=True)
    wanted = {m.name for m in val_todo}
    with (
        open_tar(val, "the validation archive", "r|") as tar,
        tqdm(total=len(val_todo), desc="val images", unit="img") as bar,
    ):
        for member in tar:
            if member.name in wanted:
                write_member(tar, member, _staged_path(staged, labels, member))
                bar.update()
    per_class = Counter(labels.val.values())
    for wnid, expected in per_class.items():
        found = sum(1 for p in (staged / wnid).iterdir() if not p.name.startswith("."))
        if found != expected:
            raise ArchiveError(
                f"{staged / wnid} holds {found} images, not the {expected} the ground truth names: run again"
            )
    os.replace(staged, out / "val")
    shutil.rmtree(out / PARTIAL, ignore_errors=True)
    classes = check_imagefolder_root(str(out))  # the loader's own layout check
    record = {
        "archives": {p.name: p.stat().st_size for p in (train, val, devkit)},
        "classes": len(classes),
        "train_images": sum(sum(1 for _ in (out / "train" / c).iterdir()) for c in classes),
        "val_images": len(images),
    }
    tmp = record_path.with_name(f".{PREPARED}.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, record_path)
    print(
        f"prepared {out}: {record['train_images']:,} training images and {record['val_images']:,} validation images "
        f"in {record['classes']} classes; decode every image once with: python scripts/check_imagefolder.py {out}"
    )
    return record


def _staged_path(staged: Path, labels: Labels, member: tarfile.TarInfo) -> Path:
    name = PurePosixPath(member.name).name
    return staged / labels.val[int(VAL_IMAGE.match(name).group(1))] / name


def _staged(staged: Path, labels: Labels, member: tarfile.TarInfo) -> bool:
    path = _staged_path(staged, labels, member)
    return path.is_file() and path.stat().st_size == member.size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("archives", type=Path, help=f"the folder with {TRAIN_ARCHIVE}, {VAL_ARCHIVE}, {DEVKIT_ARCHIVE}")
    parser.add_argument("--out", type=Path, required=True, help="the ImageFolder root to write (data.root)")
    parser.add_argument("--train", type=Path, help=f"the training archive (default: <archives>/{TRAIN_ARCHIVE})")
    parser.add_argument("--val", type=Path, help=f"the validation archive (default: <archives>/{VAL_ARCHIVE})")
    parser.add_argument("--devkit", type=Path, help=f"the devkit (default: <archives>/{DEVKIT_ARCHIVE})")
    parser.add_argument(
        "--workers",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="processes extracting classes (default: up to 8)",
    )
    parser.add_argument(
        "--verify", action="store_true", help="check each archive's MD5 against the published one first"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="read the archives' headers, check labels and disk; write nothing"
    )
    args = parser.parse_args(argv)
    try:
        prepare(
            args.train or args.archives / TRAIN_ARCHIVE,
            args.val or args.archives / VAL_ARCHIVE,
            args.devkit or args.archives / DEVKIT_ARCHIVE,
            args.out,
            workers=args.workers,
            verify=args.verify,
            dry_run=args.dry_run,
        )
    except RunError as error:
        sys.exit(f"error: {error}")
