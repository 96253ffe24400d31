"""Data for the GPT-2 pipeline: tokenizer, embedded pydoc tokens, SlimPajama preparation, batches."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from training.gpt2.data import (
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
    write_tokens,
)

from training.config import RunError

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    spec = importlib.util.spec_from_file_location("prepare_slimpajama", ROOT / "scripts" / "prepare_slimpajama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tokenizer_is_gpt2_bpe():
    tokenizer = gpt2_tokenizer()
    # Reference ids from OpenAI's GPT-2 vocabulary.
    assert tokenizer("Hello world")["input_ids"] == [15496, 995]
    assert tokenizer.decode([464, 2068, 7586, 21831]) == "The quick brown fox"
    assert encode_documents(["Hi", "<|endoftext|>"]) == [[17250, EOT], [27, 91, 437, 1659, 5239, 91, 29, EOT]]


def test_prepare_pydoc_splits_the_topics_token_stream(tmp_path):
    from pydoc_data.topics import topics

    meta = prepare_pydoc(tmp_path)
    train, val = load_split(tmp_path, "train", prepare_command="x"), load_split(tmp_path, "val", prepare_command="x")
    assert (len(train), len(val)) == (meta["train_tokens"], meta["val_tokens"])
    assert len(val) == pytest.approx(0.1 * (len(train) + len(val)), abs=1)
    stream = np.concatenate([train, val])
    assert np.count_nonzero(stream == EOT) == len(topics)  # one end-of-text per topic
    text = gpt2_tokenizer().decode(stream[: np.argmax(stream == EOT)].tolist())
    assert text in topics.values()
    assert not list(tmp_path.glob("*.tmp"))


@pytest.fixture(scope="module")
def pydoc(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pydoc")
    prepare_pydoc(folder)
    return folder


def test_corpus_vocabulary_is_the_corpus_tokens_closed_under_the_merges(pydoc):
    train, val = load_split(pydoc, "train", prepare_command="x"), load_split(pydoc, "val", prepare_command="x")
    vocabulary = corpus_vocabulary(train, val)
    assert (np.diff(vocabulary) > 0).all() and vocabulary[-1] == EOT
    assert set(np.unique(np.concatenate([train, val])).tolist()) <= set(vocabulary.tolist())
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
    from pydoc_data.topics import topics

    data = load_data(OmegaConf.create({"name": "pydoc", "dir": str(pydoc), "vocabulary": "corpus"}), context=16, is_main=True)
    full = load_split(pydoc, "train", prepare_command="x")
    np.testing.assert_array_equal(data.vocabulary[data.train], full)  # the same tokens, renumbered
    assert data.vocab_size == len(data.vocabulary) and int(data.train.max()) < data.vocab_size
    tokenizer = corpus_tokenizer(data.vocabulary)
    compact = {int(g): i for i, g in enumerate(data.vocabulary)}
    texts = list(topics.values())
    for text, ids in zip(texts, gpt2_tokenizer()(texts, split_special_tokens=True)["input_ids"]):  # the whole corpus
        assert tokenizer(text, split_special_tokens=True)["input_ids"] == [compact[i] for i in ids]
    assert tokenizer.eos_token_id == data.vocab_size - 1 and tokenizer.decode([data.vocab_size - 1]) == "<|endoftext|>"
    unseen = "Ωmega ∑ 数据 🙂 zyzzyva"  # outside the corpus: still encodes, through the byte tokens
    ids = tokenizer(unseen)["input_ids"]
    assert max(ids) < data.vocab_size and tokenizer.decode(ids) == unseen


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
        (b"\0" * 11, '{"train_tokens": 5}', r"train.bin has 11 bytes, not a whole number of uint16 tokens \(cut short\?\); prepare it again with: make-it"),
        (b"", '{"train_tokens": 0}', r"train.bin holds 0 tokens, fewer than the 34 needed \(one window of model.n_positions \+ 1"),
        (b"\0" * 20, '{"train_tokens": 10}', r"train.bin holds 10 tokens, fewer than the 34 needed"),
        (b"\0" * 100, '{"train_tokens": 5', r"meta.json is not valid JSON \(.*\); prepare the dataset again with: make-it"),
    ],
)
def test_damaged_token_files_name_the_file_and_the_fix(tmp_path, train_bytes, meta, message):
    (tmp_path / "train.bin").write_bytes(train_bytes)
    (tmp_path / "meta.json").write_text(meta)
    with pytest.raises(DatasetNotPreparedError, match=message) as error:
        load_split(tmp_path, "train", prepare_command="make-it", min_tokens=34)
    assert str(tmp_path) in str(error.value) and "\n" not in str(error.value)


def _slimpajama_like(folder: Path) -> dict[str, list[str]]:
    """200 rows with SlimPajama-6B's columns, as train/validation parquet files."""
    rng = np.random.default_rng(0)
    words = ["the", "sparse", "transformer", "optimizer", "mirror", "descent", "weights", "é", "数据", "\n"]
    texts = {}
    (folder / "data").mkdir(parents=True)
    for split, rows in (("train", 180), ("validation", 20)):
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
    args = ["--source", str(tmp_path / "src"), "--out", str(out), "--num-proc", "2", "--cache-dir", str(tmp_path / "cache")]
    script.main(args)

    meta = json.loads((out / "meta.json").read_text())
    for name, split in (("train", "train"), ("val", "validation")):
        expected = np.concatenate([np.array(ids, dtype=np.uint16) for ids in encode_documents(texts[split])])
        tokens = load_split(out, name, prepare_command="x")
        np.testing.assert_array_equal(tokens, expected)  # documents in order, EOT after each
        assert meta[f"{name}_tokens"] == len(expected) and meta[f"{name}_documents"] == len(texts[split])

    # A rerun does nothing; with one split gone, only that split is redone.
    train_mtime = (out / "train.bin").stat().st_mtime_ns
    script.main(args)
    assert "already prepared" in capsys.readouterr().out
    (out / "val.bin").unlink()
    script.main(args)
    assert "skipping split 'train'" in capsys.readouterr().out
    assert (out / "train.bin").stat().st_mtime_ns == train_mtime
    assert (out / "val.bin").is_file() and not list(out.glob("*.tmp"))


def test_write_tokens_checks_the_count(tmp_path):
    with pytest.raises(RuntimeError, match="wrote 3 tokens, expected 4"):
        write_tokens(tmp_path / "x.bin", [[1, 2, 3]], 4)
    assert not (tmp_path / "x.bin").exists()


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
