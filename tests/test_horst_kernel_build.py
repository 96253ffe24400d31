"""The C kernel's build under concurrency: 4 processes (torchrun's ranks, a job array on a
shared home) start on one empty cache at the same moment, build and load the kernel and take a
HORST step. No process crashes or warns, the cache ends with one library built once, and every
process computes the same step. One round costs a real build (~10 s on 2 loaded cores): the
default runs 2 rounds, ``-m slow`` 20.
"""

from __future__ import annotations

import multiprocessing
import os
import stat
import warnings
from pathlib import Path

import pytest
import torch

PROCESSES = 4


def _builder(folders: list[str], barrier, results) -> None:
    """In each round: wait for the others, then build (or wait for the build) and step."""
    from horst import HORST, _cpu_kernel, _fast_path

    warnings.simplefilter("error")  # a private rebuild (KernelCacheWarning) or a fallback fails the round
    for folder in folders:
        os.environ["HORST_CACHE_DIR"] = folder
        _cpu_kernel._kernel.cache_clear()
        generator = torch.Generator().manual_seed(0)
        param = torch.nn.Parameter(torch.randn(64, 33, generator=generator))
        param.grad = torch.randn(64, 33, generator=generator)
        optimizer = HORST([param], lr=1e-2, alpha=20.0, beta=0.5, fused=True)
        barrier.wait()
        optimizer.step()
        assert not _fast_path._failed
        results.put((folder, os.getpid(), param.detach().numpy().tobytes()))


@pytest.fixture
def logging_compiler(tmp_path, monkeypatch) -> Path:
    """``$CC``: the system compiler behind a script that logs each build (its ``-o`` target)."""
    log = tmp_path / "builds.log"
    script = tmp_path / "cc"
    real = os.environ.get("CC", "cc")
    script.write_text(f'#!/bin/sh\ncase "$*" in *" -o "*) echo "$*" >> {log};; esac\nexec {real} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CC", str(script))
    return log


def _concurrent_builds(tmp_path: Path, log: Path, rounds: int) -> None:
    folders = [str(tmp_path / f"cache{index}") for index in range(rounds)]
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(PROCESSES), context.Queue()
    workers = [context.Process(target=_builder, args=(folders, barrier, results)) for _ in range(PROCESSES)]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=120 + 60 * rounds) for _ in range(PROCESSES * rounds)]
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0] * PROCESSES  # no crash, no failed assertion
    steps = {step for _, _, step in outcomes}
    assert len(steps) == 1  # every process, every round: the same step
    builds = log.read_text().splitlines()
    for folder in folders:
        assert sum(1 for _, _, _ in (o for o in outcomes if o[0] == folder)) == PROCESSES
        libraries = [p.name for p in Path(folder).iterdir() if p.suffix == ".so"]
        assert len(libraries) == 1, libraries
        assert sorted(p.name for p in Path(folder).iterdir()) == sorted(
            [libraries[0], libraries[0] + ".lock", libraries[0] + ".sha256"]
        )  # no temporary left behind
        assert sum(f"{folder}/" in line for line in builds) == 1, (
            builds
        )  # built once, by one process ("cache1/", not "cache10/")


def test_concurrent_builds_into_one_cache(tmp_path, logging_compiler):
    _concurrent_builds(tmp_path, logging_compiler, rounds=2)


@pytest.mark.slow
def test_concurrent_builds_into_one_cache_20_times(tmp_path, logging_compiler):
    _concurrent_builds(tmp_path, logging_compiler, rounds=20)
