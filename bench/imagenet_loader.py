"""Images per second per worker of the DeiT ImageNet input pipeline, on a generated ImageFolder.

    OMP_WAIT_POLICY=PASSIVE python bench/imagenet_loader.py [--workers 2] [--rounds 5]

JPEGs of ImageNet's typical size (500 x 375, quality 90) are written into a temporary ImageFolder
root and read through the DeiT recipe's training transform (`experiment=deit_tiny_acdc_s70`:
random resized crop, flip, RandAugment m9, colour jitter, random erasing) as `train_vit.py`
builds it, by two loaders over the same dataset, timed one epoch each in interleaved rounds (in
a new random order each round) so that load from other processes hits both alike:

* reference: a DataLoader as the pipeline had it, torch's defaults (workers forked at every
  epoch and every evaluation, 2 batches prefetched per worker);
* pipeline: `horst_sparse.vit.data.TrainLoader` (persistent workers, `PREFETCH_FACTOR`).

An epoch's time includes starting its workers where the loader starts them then: the
reference at every epoch, the pipeline once (its first epoch, reported apart). The table gives
the median images/s per worker over the rounds and the ratio to the reference (the median over
rounds of the ratio within a round). The last lines time listing the train folder: torchvision's
scan, and `image_files` reading its cached list.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: idle OpenMP threads sleep, not spin

import argparse  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import _provenance  # noqa: E402  (bench/, beside this script)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from horst_sparse.vit.data import (  # noqa: E402
    PREFETCH_FACTOR,
    TrainLoader,
    _Items,
    _Seeded,
    build_datasets,
    file_list_paths,
    image_files,
)

SIZE = (500, 375)  # ImageNet's most common image size


def write_imagefolder(root: Path, *, classes: int, per_class: int, seed: int = 0) -> None:
    """train/ and val/ of `classes` folders of `per_class` JPEGs: smooth colour fields plus noise,
    so they compress and decode like photographs rather than flat colours or pure noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0 : SIZE[1], 0 : SIZE[0]] / max(SIZE)
    for split, count in (("train", per_class), ("val", 1)):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True)
            for i in range(count):
                a, b, phase = rng.uniform(1, 8, size=3)
                field = np.stack([np.sin(a * x + phase), np.cos(b * y), np.sin(a * x * y + b)], axis=-1)
                pixels = 127 + 100 * field + rng.normal(0, 12, size=field.shape)
                image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
                image.save(folder / f"n{c:08d}_{i}.JPEG", quality=90)
    old = time.time() - 3600  # past horst_sparse.vit.data.RACY_MTIME_S, so the file list may be cached
    for directory in [p for p in root.rglob("*") if p.is_dir()]:
        os.utime(directory, (old, old))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of each loader")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--per-class", type=int, default=32, help="training images per class")
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()

    from horst_sparse.compose import compose
    from horst_sparse.pipeline import get

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_imagefolder(root, classes=args.classes, per_class=args.per_class)
        cfg = compose(
            get("vit"), ["experiment=deit_tiny_acdc_s70", f"data.root={root}", f"data.minival_size={args.classes}"]
        )
        train = build_datasets(cfg.data, cfg.aug, img_size=cfg.model.img_size).train

        pipeline = TrainLoader(
            train,
            batch_size=args.batch,
            seed=0,
            rank=0,
            world_size=1,
            repeated_aug=1,
            num_workers=args.workers,
            pin_memory=False,
        )
        reference_items = _Items()
        reference = torch.utils.data.DataLoader(
            _Seeded(train), batch_size=args.batch, sampler=reference_items, drop_last=True, num_workers=args.workers
        )

        def epoch_of(name: str, epoch: int):
            loader = pipeline.epoch(epoch)
            if name == "reference":  # the same items (images and augmentation seeds) as the pipeline's
                reference_items.items = list(pipeline.samples.items)
                loader = reference
            return loader

        images = len(pipeline) * args.batch
        start = time.perf_counter()
        for _ in epoch_of("pipeline", 0):  # starts its workers, which then persist
            pass
        first_epoch = time.perf_counter() - start

        rates: dict[str, list[float]] = {"reference": [], "pipeline": []}
        shuffler = random.Random(0)
        for epoch in range(1, args.rounds + 1):
            order = list(rates)
            shuffler.shuffle(order)
            for name in order:
                loader = epoch_of(name, epoch)
                start = time.perf_counter()
                for _ in loader:
                    pass
                rates[name].append(images / (time.perf_counter() - start) / args.workers)

        folder = root / "train"
        file_list_paths(folder)[0].unlink()
        classes = sorted(p.name for p in folder.iterdir())
        from torchvision.datasets.folder import IMG_EXTENSIONS

        start = time.perf_counter()
        files = len(image_files(folder, classes, IMG_EXTENSIONS))  # lists the folder, writes the cache
        scan = time.perf_counter() - start
        start = time.perf_counter()
        image_files(folder, classes, IMG_EXTENSIONS)
        cached = time.perf_counter() - start

    commit = _provenance.commit()
    print(
        f"# bench/imagenet_loader.py --workers {args.workers} --rounds {args.rounds} --classes {args.classes} "
        f"--per-class {args.per_class} --batch {args.batch}"
    )
    print(
        f"# commit {commit}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(
        f"# {images} images a round ({SIZE[0]} x {SIZE[1]} JPEG, q90) through the DeiT training transform at "
        f"{cfg.model.img_size} px; images/s/worker: median over {args.rounds} interleaved rounds; ratio: median over "
        "the rounds of the pipeline's rate / the reference's in the same round"
    )
    print(f"{'loader':<58} {'img/s/worker':>12} {'ratio':>6} {'min':>7} {'max':>7}")
    labels = {
        "reference": "reference (workers forked every epoch, prefetch 2)",
        "pipeline": f"pipeline (persistent workers, prefetch {PREFETCH_FACTOR})",
    }
    for name, samples in rates.items():
        ratio = statistics.median(p / r for p, r in zip(samples, rates["reference"]))
        print(
            f"{labels[name]:<58} {statistics.median(samples):12.1f} {ratio:6.2f} {min(samples):7.1f} {max(samples):7.1f}"
        )
    print(f"# the pipeline's first epoch, starting its workers: {images / first_epoch / args.workers:.1f} img/s/worker")
    print(f"# listing train/ ({files} files): scanned {scan * 1e3:.1f} ms, from the cached list {cached * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
