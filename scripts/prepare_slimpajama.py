"""Tokenize SlimPajama-6B with GPT-2's BPE into uint16 memmaps for `train_gpt2.py`.

    python scripts/prepare_slimpajama.py --out data/slimpajama_6b                 # from the hub
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
"""

from __future__ import annotations

import argparse
import os
import sys
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


def tokenize_batch(batch: dict) -> dict:
    ids = encode_documents(batch["text"])
    return {"ids": ids, "len": [len(x) for x in ids]}


def load_split(source: str, split: str, *, cache_dir: str | None):
    import datasets

    try:
        return datasets.load_dataset(source, split=split, cache_dir=cache_dir)
    except (FileNotFoundError, ValueError, ConnectionError) as error:
        where = (
            "local folder"
            if Path(source).exists()
            else "hub dataset (offline? set HF_HUB_OFFLINE=0, or pass a local folder)"
        )
        sys.exit(f"error: cannot load split {split!r} of {where} {source}: {type(error).__name__}: {error}")


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
    args = parser.parse_args(argv)

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
