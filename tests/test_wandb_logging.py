"""What a run logs to Weights & Biases, read back from the offline run's own transaction log
(`run-<id>.wandb`, scanned here and parsed with wandb's own protobuf records): name, group,
job type, tags, namespaced numeric metrics, the epoch axis, the one-shot table and plot,
histograms, and the results artifact."""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import _compose, _load_entry_point, compose_cfg, deit_overrides, tiny_overrides

from horst_sparse.gpt2.run import run as gpt2_run
from horst_sparse.vit.run import run as vit_run

pytestmark = pytest.mark.usefixtures("quiet_env", "quiet_single_threaded")

NAMESPACES = ("train/", "val/", "prune/", "sparsity/", "perf/", "weights/")


# The transaction log's framing (wandb-core writes it; checked with wandb 0.29 and 0.31): LevelDB's
# log format (github.com/google/leveldb/blob/main/doc/log_format.md) after a 7-byte header,
# with zlib's CRC-32 seeded by the chunk type instead of CRC-32C. wandb has no public reader:
# `wandb.sdk.internal.datastore`, the Python one, went in 0.30, and `wandb leet inspect --json`
# (wandb-core's, 0.31 on) is a CLI that older versions lack, so the framing is read here and the
# records are parsed with `wandb.proto.wandb_internal_pb2`, the records' schema in every version.
WANDB_LOG_HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)  # ident, magic, version 0
WANDB_LOG_BLOCK, WANDB_LOG_CHUNK_HEADER = 32768, 7  # chunk: crc32 (u32), length (u16), type (u8)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def scan_wandb_log(raw: bytes) -> tuple[list[bytes], bool]:
    """The serialized records of a transaction log, and whether it ends on a whole record
    (a log still being written may stop anywhere)."""
    assert raw.startswith(WANDB_LOG_HEADER), "not a version-0 W&B transaction log"
    records, pending, position = [], None, len(WANDB_LOG_HEADER)
    while position < len(raw):
        left = WANDB_LOG_BLOCK - position % WANDB_LOG_BLOCK
        if left < WANDB_LOG_CHUNK_HEADER:  # a block's tail too short for a chunk is zero padding
            assert not any(raw[position : position + left]), f"invalid padding at byte {position}"
            position += left
            continue
        if position + WANDB_LOG_CHUNK_HEADER > len(raw):
            break
        checksum, length, kind = struct.unpack_from("<IHB", raw, position)
        data = raw[position + WANDB_LOG_CHUNK_HEADER : position + WANDB_LOG_CHUNK_HEADER + length]
        if len(data) < length:
            break
        assert checksum == zlib.crc32(data, zlib.crc32(bytes([kind]))), f"corrupt chunk at byte {position}"
        position += WANDB_LOG_CHUNK_HEADER + length
        if kind == FULL and pending is None:
            records.append(data)
        elif kind == FIRST and pending is None:
            pending = data
        elif kind in (MIDDLE, LAST) and pending is not None:
            pending += data
            if kind == LAST:
                records.append(pending)
                pending = None
        else:
            raise AssertionError(f"unexpected chunk type {kind} at byte {position}")
    return records, pending is None and position >= len(raw)


def read_wandb_run(run_dir: Path, timeout: float = 60.0) -> dict:
    """The records of the offline run in `run_dir`, by type, as wandb itself stores them.

    Offline, `run.finish()` returns before wandb-core has written the log's last block (seen
    with wandb 0.29 and 0.31): the log is read until it is whole and has its exit record, the
    last one wandb writes."""
    from wandb.proto import wandb_internal_pb2

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + timeout
    while True:
        chunks, whole = scan_wandb_log(path.read_bytes())
        records = defaultdict(list)
        for data in chunks:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            records[kind].append(getattr(record, kind))
        if whole and records["exit"]:
            break
        assert time.monotonic() < deadline, f"{path} has no exit record {timeout:.0f} s after the run finished"
        time.sleep(0.05)
    history = [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in h.item}
        for h in records["history"]
    ]
    return {
        "run": records["run"][0],
        "history": history,
        "metric": records["metric"],
        "artifact": records["artifact"],
        "exit": records["exit"],
    }


def logged_keys(history: list[dict]) -> set[str]:
    """Top-level keys of the history (a table or histogram's fields joined back to its key)."""
    keys = set()
    for row in history:
        for key in row:
            if key.startswith("_"):
                continue
            head = key.split("/")
            keys.add("/".join(head[:2]) if head[0] in ("train", "val", "prune", "sparsity", "perf", "weights") else key)
    return keys


@pytest.mark.slow  # ~30 s: the ViT's run through wandb's reader stays in the default suite
def test_gpt2_run_reads_at_a_glance_in_wandb(pydoc_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(
        pydoc_dir, "logging.group=table_a", "optimizer.alpha=30", "optimizer.beta=1"
    )  # not the pick's
    gpt2_run(compose_cfg(overrides), run_dir=run_dir)
    logged = read_wandb_run(run_dir)

    run = logged["run"]
    assert run.display_name == "gpt2_nano horst(a=30,b=1) seed0" and run.run_group == "table_a"
    assert run.job_type == "gpt2" and {"horst", "gpt2_nano", "pydoc"} <= set(run.tags)
    keys = logged_keys(logged["history"])
    assert {"train/loss", "train/lr", "train/tokens", "perf/tokens_per_s", "val/loss", "val/ppl"} <= keys
    assert all(k.startswith(NAMESPACES) for k in keys), keys
    assert not any("@" in k for k in keys)  # no loose per-sparsity scalars: one table instead
    table = next(row for row in logged["history"] if "prune/perplexity/_type" in row)
    assert table["prune/perplexity/_type"] == "table-file" and table["prune/perplexity/nrows"] == 3
    assert "prune/perplexity_plot_table/_type" in table  # the line plot's table
    assert any(row.get("weights/log10_abs/_type") == "histogram" for row in logged["history"])
    assert any(a.type == "results" and a.name == f"results-{run.run_id}" for a in logged["artifact"])
    assert all(
        isinstance(v, (int, float))
        for row in logged["history"]
        for k, v in row.items()
        if k in ("train/loss", "train/lr", "val/ppl")
    )


def test_vit_run_has_an_epoch_axis_and_numeric_phase(imagenet_root, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    summary = vit_run(_compose(deit_overrides(imagenet_root)), run_dir=run_dir)
    logged = read_wandb_run(run_dir)

    run = logged["run"]
    assert run.display_name == "vit_nano horst(a=10,b=0.1) s0.8 seed0" and run.job_type == "vit"
    assert {"horst", "vit_nano", "sparsity=0.8", "imagefolder"} <= set(run.tags)
    axes = {m.glob_name: m.step_metric for m in logged["metric"] if m.glob_name}
    assert axes["val/*"] == "epoch" and axes["sparsity/*"] == "epoch"
    epochs = [row for row in logged["history"] if "val/top1" in row]
    assert [row["epoch"] for row in epochs] == list(range(6))
    assert [row["val/phase_id"] for row in epochs] == [0, 1, 1, 2, 1, 1]
    assert all("val/phase" not in row for row in logged["history"])  # strings stay in metrics.jsonl
    keys = logged_keys(logged["history"])
    assert all(k.startswith(NAMESPACES) or k == "epoch" for k in keys), keys
    assert any("val/epochs/_type" in row for row in logged["history"])  # the per-epoch table
    assert epochs[-1]["val/top1"] == pytest.approx(summary["top1"])


def test_a_failed_cell_of_a_one_process_multirun_ends_as_failed_and_gives_back_the_signal(
    pydoc_dir, tmp_path, monkeypatch
):
    """Hydra's basic launcher runs the cells in one process. A cell that fails (here: a
    non-finite loss, exit code 4) must end its W&B run with its exit code (W&B would otherwise
    mark it finished when the next cell starts) and hand back SIGUSR2's handler and its run
    folder's lock; the next cell finishes normally."""
    import signal
    import sys

    monkeypatch.setenv("WANDB_MODE", "offline")
    before = signal.getsignal(signal.SIGUSR2)
    sweep = tmp_path / "sweep"
    overrides = tiny_overrides(pydoc_dir, "train.lr=1e-3", "train.min_lr=1e-4", "optimizer.alpha=1e5,10")
    monkeypatch.setattr(sys, "argv", ["train_gpt2.py", "-m", *overrides, f"hydra.sweep.dir={sweep}"])
    with pytest.raises(SystemExit) as exit_info:
        _load_entry_point("train_gpt2").main()
    assert str(exit_info.value.code).startswith("1 cell(s) of this multirun failed")  # exit status 1
    (failed,), (finished,) = sweep.glob("0_*"), sweep.glob("1_*")
    assert json.loads((failed / "failed.json").read_text())["exit_code"] == 4
    assert (finished / "summary.json").is_file()
    assert [e.exit_code for e in read_wandb_run(failed)["exit"]] == [4]
    assert [e.exit_code for e in read_wandb_run(finished)["exit"]] == [0]
    assert signal.getsignal(signal.SIGUSR2) is before
    assert not (failed / ".lock").exists() and not (finished / ".lock").exists()


def test_an_offline_run_continued_after_an_interruption_is_one_offline_folder_with_the_whole_log(
    imagenet_root, tmp_path, monkeypatch, capfd
):
    """W&B cannot append to an offline run: the continued run's folder gets the whole log
    (replayed from metrics.jsonl), the interrupted run's folder goes, and `wandb sync` of the
    one folder printed at the end uploads what an uninterrupted run would have."""
    from horst_sparse.training import runner

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_SILENT", raising=False)  # W&B's own warnings must show, if any
    overrides = deit_overrides(imagenet_root)
    reference = tmp_path / "reference"
    vit_run(_compose(overrides), run_dir=reference)

    class Interrupted(Exception):
        pass

    save_checkpoint = runner.save_checkpoint

    def save_then_die_after_epoch_1(state, path):
        save_checkpoint(state, path)
        if state["epoch"] == 2:
            raise Interrupted

    run_dir = tmp_path / "interrupted"
    monkeypatch.setattr(runner, "save_checkpoint", save_then_die_after_epoch_1)
    with pytest.raises(Interrupted):
        vit_run(_compose(overrides), run_dir=run_dir)
    monkeypatch.setattr(runner, "save_checkpoint", save_checkpoint)
    runner._open_run.close(exit_code=1)  # as hydra_task closes a run that raised
    capfd.readouterr()
    vit_run(_compose(overrides), run_dir=run_dir)
    out, err = capfd.readouterr()

    (folder,) = (run_dir / "wandb").glob("offline-run-*")  # one folder, whatever the resumes
    assert f"W&B offline run: upload it with `wandb sync {folder}`" in out
    assert "resume" not in err.lower(), err  # no "`resume` will be ignored" from W&B
    volatile = {"_runtime", "_timestamp", "perf/images_per_s"}
    history = [{k: v for k, v in row.items() if k not in volatile} for row in read_wandb_run(run_dir)["history"]]
    expected = [{k: v for k, v in row.items() if k not in volatile} for row in read_wandb_run(reference)["history"]]
    files = ("path", "sha256", "artifact")  # where a table's file lies: random per run
    strip_files = lambda rows: [{k: v for k, v in r.items() if not any(f in k for f in files)} for r in rows]  # noqa: E731
    assert strip_files(history) == strip_files(expected)
