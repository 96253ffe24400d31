"""Data for the GPT-2 pipeline: tokenizer, embedded pydoc tokens, SlimPajama preparation, batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import ROOT
from omegaconf import OmegaConf

from horst_sparse.gpt2.data import (
    EOT,
    DatasetNotPreparedError,
    RandomWindows,
    check_run_vocabulary,
    corpus_tokenizer,
    corpus_vocabulary,
    encode_documents,
    gpt2_tokenizer,
    load_data,
    load_split,
    prepare_pydoc,
    pydoc_split,
    write_tokens,
)
from horst_sparse.training.config import RunError


def _load_script():
    from scripts import prepare_slimpajama

    return prepare_slimpajama


def test_tokenizer_is_gpt2_bpe():
    tokenizer = gpt2_tokenizer()
    # Reference ids from OpenAI's GPT-2 vocabulary.
    assert tokenizer("Hello world")["input_ids"] == [15496, 995]
    assert tokenizer.decode([464, 2068, 7586, 21831]) == "The quick brown fox"
    assert encode_documents(["Hi", "<|endoftext|>"]) == [[17250, EOT], [27, 91, 437, 1659, 5239, 91, 29, EOT]]


def test_prepare_pydoc_splits_by_whole_topics_disjoint_and_fixed(tmp_path):
    from pydoc_data.topics import topics

    meta = prepare_pydoc(tmp_path)
    streams = {split: load_split(tmp_path, split, prepare_command="x") for split in ("train", "validation", "test")}
    assert [len(s) for s in streams.values()] == [meta["train_tokens"], meta["val_tokens"], meta["test_tokens"]]
    splits = meta["topics"]
    assert sorted(sum(splits.values(), [])) == sorted(topics)  # every topic in exactly one split
    total = sum(len(s) for s in streams.values())
    for split in ("validation", "test"):  # by whole topics, close to (at most) a tenth of the tokens each
        assert 0.08 * total < len(streams[split]) <= 0.1 * total
    for split, tokens in streams.items():  # each split is its topics' texts, in the recorded order
        ends = np.flatnonzero(tokens == EOT)
        assert len(ends) == len(splits[split]) and ends[-1] == len(tokens) - 1
        documents = np.split(tokens, ends[:-1] + 1)
        for name in (splits[split][0], splits[split][-1]):
            i = splits[split].index(name)
            assert gpt2_tokenizer().decode(documents[i][:-1].tolist()) == topics[name]
    assert prepare_pydoc(tmp_path / "again")["topics"] == splits  # fixed: not a function of anything but the topics
    assert not list(tmp_path.glob("*.tmp"))


def test_a_pydoc_folder_of_an_older_layout_is_prepared_again(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"dataset": "pydoc_data.topics", "train_tokens": 3}))
    (tmp_path / "train.bin").write_bytes(b"\0" * 6)
    data = load_data(
        OmegaConf.create({"name": "pydoc", "dir": str(tmp_path), "vocabulary": "full"}), context=16, is_main=True
    )
    assert json.loads((tmp_path / "meta.json").read_text())["split"] == "by topic" and len(data.train) > 100_000


def test_pydoc_split_fills_held_out_splits_in_a_fixed_order():
    sizes = {"a": 50, "b": 5, "c": 5, "d": 30, "e": 5, "f": 5}  # 100 tokens: 10 each for validation and test
    splits = pydoc_split(sizes, held_out=0.1, seed=0)
    assert sorted(sum(splits.values(), [])) == sorted(sizes)
    assert sum(sizes[n] for n in splits["validation"]) == sum(sizes[n] for n in splits["test"]) == 10
    assert {"a", "d"} <= set(splits["train"])  # too long for either: trained on
    assert pydoc_split(sizes, held_out=0.1, seed=0) == splits


@pytest.fixture(scope="module")
def pydoc(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pydoc")
    prepare_pydoc(folder)
    return folder


def test_corpus_vocabulary_is_the_corpus_tokens_closed_under_the_merges(pydoc):
    train = load_split(pydoc, "train", prepare_command="x")
    vocabulary = corpus_vocabulary(train)
    assert (np.diff(vocabulary) > 0).all() and vocabulary[-1] == EOT
    assert set(np.unique(train).tolist()) <= set(vocabulary.tolist())
    assert set(range(256)) <= set(vocabulary.tolist())  # the bytes: any text encodes
    assert 5_000 < len(vocabulary) < 8_000  # vs 50257
    spec = json.loads(gpt2_tokenizer().backend_tokenizer.to_str())["model"]
    names = {i: t for t, i in spec["vocab"].items()}
    kept = {names[i] for i in vocabulary.tolist()}
    for a, b in spec["merges"]:  # closed: every kept token's two parts are kept
        if a + b in kept:
            assert a in kept and b in kept, (a, b)
    # By hand: GPT-2 builds " the" (262, "Ġthe") as "Ġt" + "he", from "Ġ" + "t" and "h" + "e".
    small = corpus_vocabulary(np.array([262, EOT]))
    assert small[256:].tolist() == sorted([spec["vocab"]["Ġt"], spec["vocab"]["he"], 262, EOT])  # after the 256 bytes


def test_corpus_tokenizer_gives_gpt2s_segmentation_in_compact_ids(pydoc):
    """The vocabulary is the training split's: training text keeps GPT-2's segmentation,
    held-out text is the corpus tokenizer's encoding (its unseen tokens in smaller pieces)."""
    from pydoc_data.topics import topics

    config = OmegaConf.create({"name": "pydoc", "dir": str(pydoc), "vocabulary": "corpus"})
    data = load_data(config, context=16, is_main=True, eval_split="test")
    full = {split: load_split(pydoc, split, prepare_command="x") for split in ("train", "validation", "test")}
    np.testing.assert_array_equal(data.vocabulary[data.train], full["train"])  # the same tokens, renumbered
    assert data.vocab_size == len(data.vocabulary) and int(data.train.max()) < data.vocab_size
    np.testing.assert_array_equal(data.vocabulary, corpus_vocabulary(full["train"]))  # held-out text chooses nothing
    tokenizer = corpus_tokenizer(data.vocabulary)
    compact = {int(g): i for i, g in enumerate(data.vocabulary)}
    splits = json.loads((pydoc / "meta.json").read_text())["topics"]
    texts = [topics[name] for name in splits["train"]]
    for text, ids in zip(texts, gpt2_tokenizer()(texts, split_special_tokens=True)["input_ids"]):  # all training text
        assert tokenizer(text, split_special_tokens=True)["input_ids"] == [compact[i] for i in ids]
    for split, stream in (("validation", data.val), ("test", data.test)):
        assert not set(np.unique(full[split]).tolist()) <= set(data.vocabulary.tolist())  # unseen tokens exist ...
        expected = [
            i
            for name in splits[split]
            for i in tokenizer(topics[name], split_special_tokens=True)["input_ids"] + [compact[EOT]]
        ]
        assert stream.tolist() == expected  # ... and are the corpus tokenizer's pieces
        assert len(stream) > len(full[split])
    assert tokenizer.eos_token_id == data.vocab_size - 1 and tokenizer.decode([data.vocab_size - 1]) == "<|endoftext|>"
    unseen = "Ωmega ∑ 数据 🙂 zyzzyva"  # outside the corpus: still encodes, through the byte tokens
    ids = tokenizer(unseen)["input_ids"]
    assert max(ids) < data.vocab_size and tokenizer.decode(ids) == unseen
    assert load_data(config, context=16, is_main=True).test is None  # read only for eval_split=test


def test_a_run_refuses_to_continue_with_another_vocabulary(tmp_path):
    check_run_vocabulary(tmp_path, np.array([0, 1, EOT]))
    check_run_vocabulary(tmp_path, np.array([0, 1, EOT]))  # the same: fine
    with pytest.raises(RunError, match="records another vocabulary.*start a new run folder"):
        check_run_vocabulary(tmp_path, None)


def test_missing_or_unfinished_dataset_is_one_clear_error(tmp_path):
    with pytest.raises(DatasetNotPreparedError, match="prepare them with: make-it"):
        load_split(tmp_path, "train", prepare_command="make-it")
    # An interrupted write leaves only a temporary file and no meta.json: still not prepared.
    (tmp_path / "train.bin.tmp").write_bytes(b"\0" * 10)
    with pytest.raises(DatasetNotPreparedError):
        load_split(tmp_path, "train", prepare_command="make-it")


@pytest.mark.parametrize(
    "train_bytes,meta,message",
    [
        (
            b"\0" * 11,
            '{"train_tokens": 5}',
            r"train.bin has 11 bytes, not a whole number of uint16 tokens \(cut short\?\); prepare it again with: make-it",
        ),
        (
            b"",
            '{"train_tokens": 0}',
            r"train.bin holds 0 tokens, fewer than the 34 needed \(one window of model.n_positions \+ 1",
        ),
        (b"\0" * 20, '{"train_tokens": 10}', r"train.bin holds 10 tokens, fewer than the 34 needed"),
        (
            b"\0" * 100,
            '{"train_tokens": 5',
            r"meta.json is not valid JSON \(.*\); prepare the dataset again with: make-it",
        ),
    ],
)
def test_damaged_token_files_name_the_file_and_the_fix(tmp_path, train_bytes, meta, message):
    (tmp_path / "train.bin").write_bytes(train_bytes)
    (tmp_path / "meta.json").write_text(meta)
    with pytest.raises(DatasetNotPreparedError, match=message) as error:
        load_split(tmp_path, "train", prepare_command="make-it", min_tokens=34)
    assert str(tmp_path) in str(error.value) and "\n" not in str(error.value)


def _slimpajama_like(folder: Path) -> dict[str, list[str]]:
    """200 rows with SlimPajama-6B's columns, as train/validation/test parquet files."""
    rng = np.random.default_rng(0)
    words = ["the", "sparse", "transformer", "optimizer", "mirror", "descent", "weights", "é", "数据", "\n"]
    texts = {}
    (folder / "data").mkdir(parents=True)
    for split, rows in (("train", 160), ("validation", 20), ("test", 20)):
        texts[split] = [" ".join(rng.choice(words, size=rng.integers(1, 60))) for _ in range(rows)]
        table = pa.table(
            {
                "text": texts[split],
                "meta": [{"redpajama_set_name": "RedPajamaC4"}] * rows,
                "__index_level_0__": list(range(rows)),
            }
        )
        pq.write_table(table, folder / "data" / f"{split}-00000-of-00001.parquet")
    return texts


def test_prepare_slimpajama_from_local_parquet(tmp_path, capsys):
    texts = _slimpajama_like(tmp_path / "src")
    script = _load_script()
    out = tmp_path / "out"
    args = [
        "--source",
        str(tmp_path / "src"),
        "--out",
        str(out),
        "--num-proc",
        "2",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    script.main(args)

    meta = json.loads((out / "meta.json").read_text())
    for name, split, key in (
        ("train", "train", "train"),
        ("validation", "validation", "val"),
        ("test", "test", "test"),
    ):
        expected = np.concatenate([np.array(ids, dtype=np.uint16) for ids in encode_documents(texts[split])])
        tokens = load_split(out, name, prepare_command="x")
        np.testing.assert_array_equal(tokens, expected)  # documents in order, EOT after each
        assert meta[f"{key}_tokens"] == len(expected) and meta[f"{key}_documents"] == len(texts[split])
        assert meta[f"{key}_source_split"] == split

    # A rerun does nothing; with one split gone, only that split is redone.
    train_mtime = (out / "train.bin").stat().st_mtime_ns
    script.main(args)
    assert "already prepared" in capsys.readouterr().out
    (out / "test.bin").unlink()  # a folder prepared before test splits existed: only test.bin is added
    script.main(args)
    printed = capsys.readouterr().out
    assert "skipping split 'train'" in printed and "skipping split 'validation'" in printed
    assert (out / "train.bin").stat().st_mtime_ns == train_mtime
    assert (out / "test.bin").is_file() and not list(out.glob("*.tmp"))


def test_the_dry_run_states_the_download_the_disk_and_the_time_from_the_dataset_card(tmp_path, capsys):
    script = _load_script()
    out = tmp_path / "out"
    script.main(
        ["--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--dry-run", "--bandwidth", "50", "--num-proc", "4"]
    )
    printed = capsys.readouterr().out
    card = script.HUB_CARD
    tokens = sum(card["split_bytes"].values()) / (card["split_bytes"]["train"] / card["train_tokens"])
    assert f"download: {card['download_bytes'] / 1e9:,.1f} GB" in printed  # 14.0 GB: the card's download_size
    assert f"{2 * tokens / 1e9:,.1f} GB stay once the two caches are deleted" in printed  # uint16 tokens
    minutes = round(card["download_bytes"] / 50e6 / 60)
    assert f"the download {minutes} min at 50 MB/s (--bandwidth)" in printed and "x 4 processes (--num-proc" in printed
    assert f"{out} {2 * tokens / 1e9:,.1f} GB for the token files (--out)" in printed
    assert "note: HF_HUB_OFFLINE=1 is set, so the run stops at once" in printed  # conftest's offline hub
    assert printed.rstrip().endswith("dry run: nothing downloaded or written")
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_the_dry_run_of_a_local_copy_measures_its_parquet_files(tmp_path, capsys):
    _slimpajama_like(tmp_path / "src")
    _load_script().main(["--source", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "--dry-run"])
    printed = capsys.readouterr().out
    assert "200 documents (160 train, 20 validation, 20 test)" in printed
    assert f"sizes from the parquet files in {tmp_path / 'src'}" in printed and "download: 0.0 GB" in printed
    assert "the download none" in printed and "note:" not in printed


def _prepare_from_the_hub(tmp_path, **env) -> subprocess.CompletedProcess:
    """The script from the hub in a clean environment: no offline variables but those in `env`,
    an empty Hugging Face cache."""
    clean = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "MAKELEVEL")}
    command = [sys.executable, str(ROOT / "scripts" / "prepare_slimpajama.py"), "--out", str(tmp_path / "out")]
    return subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=clean | {"HF_HOME": str(tmp_path / "hf")} | env,
    )


@pytest.mark.parametrize(
    "env,origin",
    [
        ({"HF_HUB_OFFLINE": "1"}, "it comes from this process's environment"),
        ({"HF_HUB_OFFLINE": "1", "MAKELEVEL": "1"}, "make exports it to its targets"),
    ],
)
def test_offline_without_the_dataset_cached_stops_at_once_naming_the_variable_and_the_fix(tmp_path, env, origin):
    done = _prepare_from_the_hub(tmp_path, **env)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Retrying" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: HF_HUB_OFFLINE=1 is set, so the hub is not asked, and split 'train' of ")
    assert (
        origin in done.stderr
        and "env -u HF_HUB_OFFLINE -u HF_DATASETS_OFFLINE python scripts/prepare_slimpajama.py" in done.stderr
    )


def test_a_hub_out_of_reach_stops_at_once_naming_it(tmp_path):
    import socket

    with socket.socket() as closed:  # a loopback port nothing listens on: refused at once
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    done = _prepare_from_the_hub(tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{port}")
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Retrying" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: cannot reach the hub at http://127.0.0.1:{port} (")
    assert "Connection refused" in done.stderr and "pass --source FOLDER" in done.stderr
    assert not (tmp_path / "out").exists()


def test_write_tokens_checks_the_count(tmp_path):
    with pytest.raises(RuntimeError, match="wrote 3 tokens, expected 4"):
        write_tokens(tmp_path / "x.bin", [[1, 2, 3]], 4)
    assert not (tmp_path / "x.bin").exists()


def test_write_tokens_leaves_no_temporary_file_when_it_fails(tmp_path):
    with pytest.raises(RuntimeError):
        write_tokens(tmp_path / "x.bin", [[1, 2, 3]], 4)
    assert list(tmp_path.iterdir()) == []


def _killed_writer(folder: Path) -> int:
    """The pid of a real `write_tokens` killed (SIGKILL) mid-file, reaped: its `train.bin.<pid>.tmp`
    stays in `folder`, as a killed prepare_slimpajama.py leaves it."""
    import subprocess
    import sys
    import time

    code = (
        "import sys, time\n"
        "from horst_sparse.gpt2.data import write_tokens\n"
        "def chunks():\n"
        "    yield [1] * 10\n"
        "    time.sleep(600)\n"
        "write_tokens(sys.argv[1], chunks(), 1000)\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", code, str(folder / "train.bin")], cwd=Path(__file__).parents[1])
    tmp = folder / f"train.bin.{writer.pid}.tmp"
    deadline = time.monotonic() + 120
    while not tmp.exists() and writer.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    writer.kill()
    writer.wait()  # reaped: its pid names no process now
    assert tmp.exists()
    return writer.pid


def test_a_rerun_of_prepare_slimpajama_removes_the_temporary_files_of_killed_writers(tmp_path, capsys):
    """A killed writer's split-sized `train.bin.<pid>.tmp` is removed by the next run (which writes under its own pid)."""
    import os

    _slimpajama_like(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    dead = _killed_writer(out)
    live = os.getppid()  # a running process that is not this one (which writes its own val.bin.<pid>.tmp)
    (out / f"val.bin.{live}.tmp").write_bytes(b"\0" * 8)  # a live writer's: kept
    (out / f"notes.{dead}.tmp").write_text("not a file of this script: kept")
    script = _load_script()
    script.main(
        ["--source", str(tmp_path / "src"), "--out", str(out), "--num-proc", "1", "--cache-dir", str(tmp_path / "c")]
    )

    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"removed 1 temporary file(s) of writers no longer running: train.bin.{dead}.tmp"
    assert sorted(p.name for p in out.glob("*.tmp")) == sorted([f"val.bin.{live}.tmp", f"notes.{dead}.tmp"])
    assert (out / "train.bin").is_file() and (out / "meta.json").is_file()  # then it prepared the folder


def test_random_windows_shift_targets_and_shard_one_global_draw():
    tokens = np.arange(1000, dtype=np.uint16)
    single = RandomWindows(tokens, context=16, seed=3)
    offsets = single.global_offsets(8)
    x, y = single.batch(offsets, torch.device("cpu"))
    assert x.shape == (8, 16) and torch.equal(y, x + 1)  # next-token targets
    assert torch.equal(x[:, 0], offsets)
    # Two processes with the same seed draw the same offsets; each takes its half.
    ranks = [RandomWindows(tokens, context=16, seed=3) for _ in range(2)]
    halves = [r.global_offsets(8).view(2, 1, 4)[rank][0] for rank, r in enumerate(ranks)]
    assert torch.equal(torch.cat(halves), offsets)


class _ReadLog:
    """Tokens whose reads record the thread that made them."""

    def __init__(self, tokens: np.ndarray) -> None:
        self.tokens, self.threads = tokens, []

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, window: slice) -> np.ndarray:
        self.threads.append(threading.current_thread().name)
        return self.tokens[window]


def test_an_updates_micro_batches_are_one_draw_each_read_ahead_in_a_thread():
    tokens = np.arange(5000, dtype=np.uint16)
    log = _ReadLog(tokens)
    ahead, plain = RandomWindows(log, context=16, seed=3), RandomWindows(tokens, context=16, seed=3)
    cpu = torch.device("cpu")
    for update in range(3):
        got = list(ahead.update(24, 4, rank=1, world_size=2, device=cpu))  # 3 micro-batches of 4 on rank 1
        offsets = plain.global_offsets(24).view(2, 3, 4)[1]
        expected = [plain.batch(offsets[micro], cpu) for micro in range(3)]
        assert len(got) == 3 and all(torch.equal(g[0], e[0]) and torch.equal(g[1], e[1]) for g, e in zip(got, expected))
        # The one draw per update from the checkpointed generator: resumed runs see the same batches.
        assert torch.equal(ahead.generator.get_state(), plain.generator.get_state()), update
    ahead._ahead[1].result()  # the read of the 4th update's first micro-batch, under way
    # Only the very first micro-batch was read in the training thread; every later one, the next
    # update's first included, by the reader thread while the previous one was being used.
    reads = [name.startswith("windows") for name in log.threads]
    assert reads == [False] * 4 + [True] * (len(reads) - 4) and len(reads) == 4 * 10
