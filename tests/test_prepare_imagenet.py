"""scripts/prepare_imagenet.py on a miniature of image-net.org's three ILSVRC2012 archives: the
per-class training tars, the flat validation folder and the devkit whose meta.mat (written by
scipy, as MATLAB wrote the real one) and ground truth label it."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from conftest import ROOT
from PIL import Image

from horst_sparse.vit import prepare_imagenet
from horst_sparse.vit.data import check_imagefolder_root

# Class IDs are not in the order of the WordNet ids (in the real devkit ID 1 is n02119789): a
# mapping by sorted wnid would put images in the wrong classes.
CLASSES = {1: "n01484850", 2: "n01440764", 3: "n01443537"}
GROUND_TRUTH = [2, 1, 3, 2, 1, 1, 3]  # the class ID of validation image 1, 2, ...


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _tar_bytes(files: dict[str, bytes], mode: str = "w") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:
        for name, data in files.items():
            _add(tar, name, data)
    return buffer.getvalue()


def _meta_mat(classes: dict[int, str]) -> bytes:
    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "wordnet_height", "num_train_images"]
    rows = [(i, w, f"class {i}", "a leaf", 0, 0, 2) for i, w in classes.items()]
    rows.append((1001, "n00001740", "entity", "an inner synset: no class", 3, 18, 0))
    buffer = io.BytesIO()
    scipy.io.savemat(buffer, {"synsets": np.array(rows, dtype=[(f, "O") for f in fields])})
    return buffer.getvalue()


def write_archives(
    folder: Path, *, classes=CLASSES, ground_truth=GROUND_TRUTH, train_extra=None, val_extra=None
) -> dict[str, bytes]:
    """The three archives under their official names; returns every image's bytes by its root-relative path."""
    folder.mkdir(parents=True, exist_ok=True)
    expected, class_tars = {}, {}
    for k, wnid in enumerate(CLASSES.values()):
        images = {f"{wnid}_{j}.JPEG": _jpeg(10 * k + j) for j in range(2 + k)}
        class_tars[f"{wnid}.tar"] = _tar_bytes(images)
        expected |= {f"train/{wnid}/{name}": data for name, data in images.items()}
    (folder / prepare_imagenet.TRAIN_ARCHIVE).write_bytes(_tar_bytes(class_tars | (train_extra or {})))
    val = {}
    for n, class_id in enumerate(GROUND_TRUTH, start=1):
        name = f"ILSVRC2012_val_{n:08d}.JPEG"
        val[name] = _jpeg(1000 + n)
        expected[f"val/{CLASSES[class_id]}/{name}"] = val[name]
    (folder / prepare_imagenet.VAL_ARCHIVE).write_bytes(_tar_bytes(val | (val_extra or {})))
    devkit = {
        "ILSVRC2012_devkit_t12/data/meta.mat": _meta_mat(classes),
        "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt": "".join(
            f"{i}\n" for i in ground_truth
        ).encode(),
    }
    (folder / prepare_imagenet.DEVKIT_ARCHIVE).write_bytes(_tar_bytes(devkit, "w:gz"))
    return expected


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for split in ("train", "val")
        for p in (root / split).rglob("*")
        if p.is_file()
    }


def _run(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "scripts" / "prepare_imagenet.py"), *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_official_archives_become_the_root_the_loader_reads_and_a_rerun_changes_nothing(tmp_path):
    expected = write_archives(tmp_path / "downloads")
    out = tmp_path / "imagenet"
    done = _run(str(tmp_path / "downloads"), "--out", str(out), "--workers", "2")
    assert done.returncode == 0, done.stderr
    assert _files(out) == expected  # every image, byte for byte, in its labelled class folder
    assert sorted(p.name for p in out.iterdir()) == ["prepared.json", "train", "val"]  # no staging left
    assert check_imagefolder_root(str(out)) == sorted(CLASSES.values())
    record = json.loads((out / "prepared.json").read_text())
    assert (record["classes"], record["train_images"], record["val_images"]) == (3, 9, len(GROUND_TRUTH))
    assert "scripts/check_imagefolder.py" in done.stdout.splitlines()[-1]
    decoded = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_imagefolder.py"), str(out), "--workers", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert decoded.returncode == 0 and "0 of 16 files cannot be read" in decoded.stdout

    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again = _run(str(tmp_path / "downloads"), "--out", str(out))
    assert again.returncode == 0 and "already prepared" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == stamps


def test_an_interrupted_preparation_keeps_finished_classes_and_redoes_the_rest(tmp_path, capsys):
    expected = write_archives(tmp_path / "downloads")
    out = tmp_path / "imagenet"
    train = tmp_path / "downloads" / prepare_imagenet.TRAIN_ARCHIVE
    first, second, _ = prepare_imagenet.class_tars(train)
    (out / "train").mkdir(parents=True)
    prepare_imagenet.extract_class(str(train), first, str(out))  # the class a killed run finished
    finished = (out / "train" / first.wnid).stat().st_mtime_ns
    left = out / ".partial" / "train" / second.wnid  # the class it was writing when killed
    left.mkdir(parents=True)
    (left / f"{second.wnid}_0.JPEG").write_bytes(b"truncated")
    staged = out / ".partial" / "val" / CLASSES[GROUND_TRUTH[0]]
    staged.mkdir(parents=True)
    (staged / "ILSVRC2012_val_00000001.JPEG").write_bytes(b"cut short")  # a size that is not the image's

    prepare_imagenet.main([str(tmp_path / "downloads"), "--out", str(out), "--workers", "1"])
    assert "3 classes; 1 of them already in" in capsys.readouterr().out
    assert _files(out) == expected
    assert (out / "train" / first.wnid).stat().st_mtime_ns == finished
    assert not (out / ".partial").exists()


def test_a_dry_run_states_what_it_would_write_and_writes_nothing(tmp_path, capsys):
    write_archives(tmp_path / "downloads")
    out = tmp_path / "imagenet"
    prepare_imagenet.main([str(tmp_path / "downloads"), "--out", str(out), "--dry-run"])
    printed = capsys.readouterr().out
    assert f"3 classes; 0 of them already in {out / 'train'}; 7 validation images, 0 already staged" in printed
    assert "still to write" in printed and "dry run: nothing written" in printed
    assert not out.exists()


def test_too_little_free_space_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    write_archives(tmp_path / "downloads")
    monkeypatch.setattr(prepare_imagenet, "free_space", lambda out: 1000)  # a full disk cannot be made here
    with pytest.raises(SystemExit) as exit:
        prepare_imagenet.main([str(tmp_path / "downloads"), "--out", str(tmp_path / "imagenet")])
    assert "has 0.0 GB free and the images still to extract need" in str(exit.value.code)
    assert not (tmp_path / "imagenet").exists()


@pytest.mark.parametrize(
    "breakage,message",
    [
        ("no_devkit", "the devkit .*ILSVRC2012_devkit_t12.tar.gz does not exist: download it from image-net.org"),
        ("not_a_tar", "the validation archive .* is not a readable tar archive"),
        ("foreign_train_member", r"holds 'README.txt', not a class tar \(nXXXXXXXX.tar\)"),
        ("foreign_val_member", r"holds 'ILSVRC2012_val_00000099.JPEG', which is no validation image"),
        ("short_ground_truth", "holds 7 images and the devkit's ground truth labels 6"),
        ("other_classes", r"only in the archive: \['n01443537'\], only in the devkit: \['n09999999'\]"),
        ("unknown_class_id", r"names class IDs that data/meta.mat does not have \(\[7\]\)"),
        ("val_not_ours", "val exists but .* has no prepared.json: it was not made by this command"),
        ("damaged_download", "has MD5 .*, not the published 1d675b47d978889d74fa0da5fadfb00e"),
    ],
)
def test_bad_input_is_one_line_naming_the_file_and_the_fix(tmp_path, breakage, message):
    downloads, out = tmp_path / "downloads", tmp_path / "imagenet"
    kwargs = {
        "foreign_train_member": {"train_extra": {"README.txt": b"not a class"}},
        "foreign_val_member": {  # as many labels as images, one image not among them
            "val_extra": {"ILSVRC2012_val_00000099.JPEG": _jpeg(0)},
            "ground_truth": [*GROUND_TRUTH, 1],
        },
        "short_ground_truth": {"ground_truth": GROUND_TRUTH[:-1]},
        "other_classes": {"classes": {1: "n01484850", 2: "n01440764", 3: "n09999999"}},
        "unknown_class_id": {"ground_truth": [*GROUND_TRUTH[:-1], 7]},
    }.get(breakage, {})
    write_archives(downloads, **kwargs)
    args = [str(downloads), "--out", str(out)]
    if breakage == "no_devkit":
        (downloads / prepare_imagenet.DEVKIT_ARCHIVE).unlink()
    elif breakage == "not_a_tar":
        (downloads / prepare_imagenet.VAL_ARCHIVE).write_bytes(b"<html>login required</html>")
    elif breakage == "val_not_ours":
        (out / "val").mkdir(parents=True)
    elif breakage == "damaged_download":
        args.append("--verify")
    with pytest.raises(SystemExit) as exit:
        prepare_imagenet.main(args)
    line = str(exit.value.code)
    assert line.startswith("error: ") and "\n" not in line
    assert re.search(message, line), line
    assert not (out / "train").exists()
