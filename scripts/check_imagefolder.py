"""Find the images of an ImageFolder root that cannot be decoded, before a job meets them.

    python scripts/check_imagefolder.py /path/to/imagenet            # train/ and val/ below it
    python scripts/check_imagefolder.py /path/to/imagenet --workers 16

Every file of the class folders under `<root>/train` and `<root>/val` (the layout
`train_vit.py data.root=...` reads) is opened and fully decoded the way the pipeline does
(`training.vit.data.read_image`), in parallel, with a progress bar. Prints one line per file
that fails (path and reason) and a count; exits 1 if any failed, so it can gate a job
script. Remove or replace those files, or run with `data.skip_corrupt=true`, which skips
them and lists them in the run folder's `skipped_images.txt`.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.vit.data import check_imagefolder_root, read_image  # noqa: E402


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
    args = parser.parse_args(argv)
    from training.config import RunError

    try:
        check_imagefolder_root(args.root)
    except RunError as error:
        sys.exit(f"error: {error}")
    root = Path(args.root).expanduser()
    files = sorted(str(p) for split in ("train", "val") for p in (root / split).glob("*/*") if p.is_file())
    bad = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = pool.map(problem, files, chunksize=64)
        for path, reason in tqdm(zip(files, results), total=len(files), desc="images", unit="img"):
            if reason is not None:
                bad.append(path)
                tqdm.write(f"{path}: {reason}")
    print(f"{len(bad)} of {len(files)} files cannot be read" + (": remove or replace them, or train with data.skip_corrupt=true" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
