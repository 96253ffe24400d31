"""Tokenize SlimPajama-6B with GPT-2's BPE into uint16 memmaps for `train_gpt2.py`.

    python scripts/prepare_slimpajama.py --out data/slimpajama_6b                 # from the hub
    python scripts/prepare_slimpajama.py --out data/slimpajama_6b --dry-run       # download size, disk, time
    python scripts/prepare_slimpajama.py --source /path/to/SlimPajama-6B --out data/slimpajama_6b

`--source` is a hub dataset id (default `DKYoon/SlimPajama-6B`) or a local folder holding
its parquet files (`data/train-*.parquet`, `data/validation-*.parquet`, ...). Every
document's `text` is tokenized (end-of-text 50256 appended) in parallel with `datasets`;
the dataset's train split becomes `train.bin`, its validation split `val.bin` (monitoring
and tuning: `eval_split: validation`), its test split `test.bin` (the reported numbers:
`eval_split: test`), and `meta.json` records the counts. A folder prepared before test
splits existed gets its `test.bin` added; the other two are kept. Each file is written under a temporary name and renamed
when complete: rerunning skips finished splits, an interrupted run never leaves a file
that looks complete (tokenized shards are also cached by `datasets`), and a rerun first deletes
the temporary files of runs that were killed.

`--dry-run` downloads and writes nothing: it prints the download's size, the disk each folder
needs (the hub cache, the `datasets` cache, `--out`) against its free space, and an estimated
time: the download at `--bandwidth` and the tokenization at the tokenizer's speed measured
here. The hub's numbers are its dataset card's (`HUB_CARD`); a local `--source` is measured.
From the hub, the hub is asked first: with `HF_HUB_OFFLINE` set (make's targets export it) and
the dataset not in the cache, or with the hub out of reach, the script stops at once in one
line that says which, instead of retrying.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
from tqdm import tqdm

from horst_sparse.gpt2.data import (
    EOT,
    META_FILE,
    SPLIT_FILES,
    encode_documents,
    gpt2_tokenizer,
    remove_stale_temp_files,
    write_meta,
    write_tokens,
)

HUB_ID = "DKYoon/SlimPajama-6B"
# The dataset's own numbers, from its dataset card on the hub (README.md: `dataset_info`, and the
# text's "roughly 6B tokens"), the one place this repository records them.
HUB_CARD = {
    "download_bytes": 14_048_972_121,  # download_size: the parquet files
    "split_bytes": {"train": 23_918_118_724, "validation": 39_109_042, "test": 40_114_950},  # num_bytes (Arrow)
    "split_documents": {"train": 5_489_000, "validation": 9_347, "test": 9_346},  # num_examples
    "train_tokens": 6_000_000_000,  # "roughly 6B tokens"; the other splits in proportion to their bytes
}
DEFAULT_BANDWIDTH_MB_S = 100.0
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
TRUE_VALUES = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's and datasets' reading of these variables


def tokenize_batch(batch: dict) -> dict:
    ids = encode_documents(batch["text"])
    return {"ids": ids, "len": [len(x) for x in ids]}


# ---- the hub: offline settings and reachability -------------------------------------------------


def offline_setting() -> str | None:
    """The variable that keeps `datasets` off the hub, as `NAME=value`, or None."""
    for name in OFFLINE_VARIABLES:
        if os.environ.get(name, "").upper() in TRUE_VALUES:
            return f"{name}={os.environ[name]}"
    return None


def offline_origin() -> str:
    # make puts MAKELEVEL into its recipes' environment: the Makefile exports HF_HUB_OFFLINE=1 there
    if "MAKELEVEL" in os.environ:
        return "make exports it to its targets (the Makefile's export HF_HUB_OFFLINE := 1)"
    return "it comes from this process's environment (a shell profile, job script or container sets it)"


def offline_fix(source: str) -> str:
    unset = " ".join(f"-u {name}" for name in OFFLINE_VARIABLES)
    return (
        f"to download, run `env {unset} python scripts/prepare_slimpajama.py ...` where the hub can be reached, or pass "
        f"--source FOLDER with a copy of {source}'s parquet files"
    )


def unreachable(endpoint: str, timeout: float = 10.0) -> str | None:
    """Why the hub at `endpoint` cannot be reached now (one request, no retries), or None. Any HTTP
    answer, an error status included, means it can."""
    try:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/api/datasets", method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as error:
        return str(getattr(error, "reason", error))
    return None


def hub_problem(source: str) -> str | None:
    """The one line that says why `source` cannot be downloaded now, or None (offline with the
    dataset in the cache is found out by the load itself, which then fails at once)."""
    from huggingface_hub import constants

    if offline_setting():
        return None
    reason = unreachable(constants.ENDPOINT)
    if reason is None:
        return None
    return (
        f"cannot reach the hub at {constants.ENDPOINT} ({reason}): this machine has no network to it; prepare "
        f"where it has one (then copy --out here), or pass --source FOLDER with a copy of {source}'s parquet files"
    )


def load_split(source: str, split: str, *, cache_dir: str | None):
    import datasets
    from huggingface_hub import constants

    try:
        return datasets.load_dataset(source, split=split, cache_dir=cache_dir)
    except (FileNotFoundError, ValueError, ConnectionError) as error:
        if Path(source).exists():
            sys.exit(
                f"error: cannot load split {split!r} of the local folder {source}: {type(error).__name__}: {error}"
            )
        setting = offline_setting()
        if setting and isinstance(error, ConnectionError):
            sys.exit(
                f"error: {setting} is set, so the hub is not asked, and split {split!r} of {source} is not in the "
                f"cache ({constants.HF_HUB_CACHE}); {offline_origin()}; {offline_fix(source)}"
            )
        sys.exit(f"error: cannot load split {split!r} of the hub dataset {source}: {type(error).__name__}: {error}")


# ---- the dry run ---------------------------------------------------------------------------------


def gb(size: float) -> str:
    return f"{size / 1e9:,.1f} GB"


def duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(1, round(seconds / 60))} min"


def source_sizes(source: str) -> dict:
    """Download bytes, Arrow bytes and documents per split, and the tokens they will make: the
    card's numbers for the hub, a local folder's own (its parquet files' sizes and footers)."""
    per_token = HUB_CARD["split_bytes"]["train"] / HUB_CARD["train_tokens"]  # the card's bytes per token
    if not Path(source).exists():
        sizes = {"download_bytes": HUB_CARD["download_bytes"], "from": f"{source}'s dataset card (HUB_CARD)"}
        sizes |= {"split_bytes": dict(HUB_CARD["split_bytes"]), "split_documents": dict(HUB_CARD["split_documents"])}
    else:
        import pyarrow.parquet as pq

        sizes = {"download_bytes": 0, "from": f"the parquet files in {source}"}
        sizes |= {"split_bytes": {}, "split_documents": {}}
        for split in ("train", "validation", "test"):
            files = sorted(Path(source).rglob(f"{split}-*.parquet"))
            metadata = [pq.ParquetFile(f).metadata for f in files]
            sizes["split_bytes"][split] = sum(
                m.row_group(i).total_byte_size for m in metadata for i in range(m.num_row_groups)
            )
            sizes["split_documents"][split] = sum(m.num_rows for m in metadata)
    sizes["tokens"] = sum(sizes["split_bytes"].values()) / per_token
    return sizes


def tokenizer_bytes_per_second() -> float:
    """GPT-2's tokenizer in one process on CPython's pydoc topics (offline): text bytes per second."""
    from pydoc_data.topics import topics

    texts = list(topics.values())
    encode_documents(texts[:10])  # the tokenizer built and warm
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        encode_documents(texts)
        best = min(best, time.perf_counter() - start)
    return sum(len(t.encode()) for t in texts) / best


def datasets_cache(cache_dir: str | None) -> Path:
    import datasets

    return Path(cache_dir).expanduser() if cache_dir else Path(datasets.config.HF_DATASETS_CACHE)


def dry_run(args) -> None:
    from huggingface_hub import constants

    sizes = source_sizes(args.source)
    tokens, documents = sizes["tokens"], sum(sizes["split_documents"].values())
    arrow = sum(sizes["split_bytes"].values())
    tokenized = tokens * 2 + documents * 12  # a uint16 list per document, its int32 offset and int64 length
    needs = [
        (Path(constants.HF_HUB_CACHE), sizes["download_bytes"], "the download (hub cache)"),
        (datasets_cache(args.cache_dir), arrow + tokenized, "its Arrow copy and the tokenized copy (datasets cache)"),
        (Path(args.out), tokens * 2, "the token files (--out)"),
    ]
    print(
        f"{args.source}: {documents:,} documents ({', '.join(f'{n:,} {s}' for s, n in sizes['split_documents'].items())}), "
        f"~{tokens / 1e9:.1f}B GPT-2 tokens; sizes from {sizes['from']}"
    )
    print(f"download: {gb(sizes['download_bytes'])}")
    print(f"disk: {gb(sum(n for _, n, _ in needs))} at the peak; {gb(tokens * 2)} stay once the two caches are deleted")
    by_device: dict[int, list] = {}
    for folder, size, what in needs:
        existing = next(p for p in (folder.resolve(), *folder.resolve().parents) if p.exists())
        by_device.setdefault(existing.stat().st_dev, []).append((folder, size, what, existing))
    for entries in by_device.values():
        free = shutil.disk_usage(entries[0][3]).free
        total = sum(size for _, size, _, _ in entries)
        where = "; ".join(f"{folder} {gb(size)} for {what}" for folder, size, what, _ in entries)
        verdict = "enough" if free >= total else "NOT ENOUGH: free space or move a cache (--cache-dir, HF_HUB_CACHE)"
        print(f"  {where}: {gb(total)} on a file system with {gb(free)} free: {verdict}")
    rate = tokenizer_bytes_per_second()
    download_s = sizes["download_bytes"] / (args.bandwidth * 1e6)
    tokenize_s = arrow / (rate * max(1, args.num_proc))
    print(
        f"time: ~{duration(download_s + tokenize_s)}: the download {duration(download_s) if download_s else 'none'} "
        f"at {args.bandwidth:g} MB/s (--bandwidth), tokenizing {gb(arrow)} of text {duration(tokenize_s)} at "
        f"{rate / 1e6:.1f} MB/s per process x {args.num_proc} processes (--num-proc; the speed measured here on "
        "CPython's pydoc text), plus the Arrow conversion and the writes at the disks' speed"
    )
    if not Path(args.source).exists():
        setting = offline_setting()
        problem = hub_problem(args.source)
        if setting:
            print(
                f"note: {setting} is set, so the run stops at once unless {args.source} is in the cache already; "
                f"{offline_origin()}; {offline_fix(args.source)}"
            )
        elif problem:
            print(f"note: the run would stop at once: {problem}")
    print("dry run: nothing downloaded or written")


def prepare_split(source: str, split: str, out_path: Path, *, num_proc: int, cache_dir: str | None) -> None:
    import datasets

    dataset = load_split(source, split, cache_dir=cache_dir)
    if "text" not in dataset.column_names:
        sys.exit(f"error: split {split!r} of {source} has no 'text' column (columns: {dataset.column_names})")
    features = datasets.Features({"ids": datasets.List(datasets.Value("uint16")), "len": datasets.Value("int64")})
    tokenized = dataset.map(
        tokenize_batch,
        batched=True,
        num_proc=num_proc if num_proc > 1 else None,
        remove_columns=dataset.column_names,
        features=features,
        desc=f"tokenizing {split}",
    )
    total = int(pc.sum(tokenized.data.column("len")).as_py() or 0)
    bar = tqdm(total=total, unit="tok", unit_scale=True, desc=f"writing {out_path.name}")

    def chunks():
        for table in tokenized.with_format("arrow").iter(batch_size=8192):
            tokens = pc.list_flatten(table.column("ids")).to_numpy()
            bar.update(len(tokens))
            yield tokens

    write_tokens(out_path, chunks(), total)
    bar.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--source", default=HUB_ID, help=f"hub dataset id or local folder of parquet files (default {HUB_ID})"
    )
    parser.add_argument("--out", default="data/slimpajama_6b", help="output folder (default data/slimpajama_6b)")
    parser.add_argument("--train-split", default="train")
    parser.add_argument(
        "--val-split", default="validation", help="the dataset's split for validation (monitoring, tuning)"
    )
    parser.add_argument("--test-split", default="test", help="the dataset's split for test (the reported numbers)")
    parser.add_argument("--num-proc", type=int, default=os.cpu_count(), help="tokenizer processes (default: all cores)")
    parser.add_argument("--cache-dir", default=None, help="datasets cache folder (default: the Hugging Face cache)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the download size, the disk needed and an estimated time; no work"
    )
    parser.add_argument(
        "--bandwidth",
        type=float,
        default=DEFAULT_BANDWIDTH_MB_S,
        help=f"the download speed the dry run assumes, MB/s (default {DEFAULT_BANDWIDTH_MB_S:g})",
    )
    args = parser.parse_args(argv)
    if args.bandwidth <= 0:
        parser.error(f"--bandwidth {args.bandwidth:g}: give the download speed in MB/s, above 0")
    if args.dry_run:
        dry_run(args)
        return

    out = Path(args.out)
    # A writer killed mid-file (SIGKILL, OOM, a job's time limit) leaves its `<file>.<pid>.tmp`, as large as
    # the split; a rerun writes under its own pid, so without this the old ones would stay forever.
    stale = remove_stale_temp_files(out) if out.is_dir() else []
    if stale:
        print(
            f"removed {len(stale)} temporary file(s) of writers no longer running: {', '.join(p.name for p in stale)}"
        )
    if (out / META_FILE).is_file() and all((out / f).is_file() for f in SPLIT_FILES.values()):
        print(f"{out} is already prepared ({out / META_FILE}); delete it to prepare again")
        return
    if not Path(args.source).exists():
        problem = hub_problem(args.source)
        if problem:
            sys.exit(f"error: {problem}")
    out.mkdir(parents=True, exist_ok=True)
    if args.num_proc > 1:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker process
    gpt2_tokenizer()  # built once here, inherited by the worker processes

    meta = {"source": args.source, "tokenizer": "gpt2", "eot": EOT, "dtype": "uint16"}
    for name, split in (("train", args.train_split), ("validation", args.val_split), ("test", args.test_split)):
        path = out / SPLIT_FILES[name]
        key = path.stem  # meta.json: train_tokens, val_tokens, test_tokens
        if path.is_file():  # complete: files only get their final name once fully written
            print(f"{path} exists, skipping split {split!r}")
        else:
            prepare_split(args.source, split, path, num_proc=args.num_proc, cache_dir=args.cache_dir)
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
        meta[f"{key}_tokens"] = len(tokens)
        meta[f"{key}_documents"] = int(np.count_nonzero(tokens == EOT))  # one end-of-text per document
        meta[f"{key}_source_split"] = split
    write_meta(out, meta)
    print(
        f"prepared {out}: {meta['train_tokens']:,} train, {meta['val_tokens']:,} validation and "
        f"{meta['test_tokens']:,} test tokens"
    )


if __name__ == "__main__":
    main()
