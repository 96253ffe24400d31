"""Find the images of an ImageFolder root that cannot be decoded, before a job meets them.

    python scripts/check_imagefolder.py /path/to/imagenet            # train/ and val/ below it
    python scripts/check_imagefolder.py /path/to/imagenet --workers 16
    python scripts/check_imagefolder.py /path/to/imagenet --minival-list minival.txt   # and the held-out list

Every file of the class folders under `<root>/train` and `<root>/val` (the layout
`train_vit.py data.root=...` reads) is opened and fully decoded the way the pipeline does
(`horst_sparse.vit.data.read_image`), in parallel, with a progress bar. Prints one line per file
that fails (path and reason) and a count; exits 1 if any failed, so it can gate a job
script. Remove or replace those files, or run with `data.skip_corrupt=true`, which skips
them and lists them in the run folder's `skipped_images.txt`. `--minival-list FILE` also
writes the training images a run holds out as its validation split (`data.minival_size`,
the recipe's 10,000; the same list each run writes to its `minival.txt`).
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tqdm import tqdm

from horst_sparse.vit.data import check_imagefolder_root, minival_indices, read_image


def problem(path: str) -> str | None:
    """Why `path` cannot be read as an image, or None."""
    try:
        read_image(path)
    except (OSError, SyntaxError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="the ImageFolder root (with train/ and val/)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="processes (default: all cores)")
    parser.add_argument("--minival-list", type=Path, help="write the held-out minival's files here, one a line")
    parser.add_argument("--minival-size", type=int, default=10000, help="data.minival_size (default 10000)")
    args = parser.parse_args(argv)
    from horst_sparse.training.config import RunError

    try:
        check_imagefolder_root(args.root)
    except RunError as error:
        sys.exit(f"error: {error}")
    root = Path(args.root).expanduser()
    if args.minival_list:
        from torchvision.datasets import ImageFolder

        train = ImageFolder(str(root / "train"))  # the listing a run holds its minival out of
        try:
            held = minival_indices(train.samples, root / "train", size=args.minival_size)
        except RunError as error:
            sys.exit(f"error: {error}")
        args.minival_list.write_text(
            "".join(f"{Path(train.samples[i][0]).relative_to(root / 'train').as_posix()}\n" for i in held)
        )
        print(f"wrote the {len(held)} minival images to {args.minival_list}")
    files = sorted(str(p) for split in ("train", "val") for p in (root / split).glob("*/*") if p.is_file())
    bad = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = pool.map(problem, files, chunksize=64)
        for path, reason in tqdm(zip(files, results), total=len(files), desc="images", unit="img"):
            if reason is not None:
                bad.append(path)
                tqdm.write(f"{path}: {reason}")
    print(
        f"{len(bad)} of {len(files)} files cannot be read"
        + (": remove or replace them, or train with data.skip_corrupt=true" if bad else "")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
