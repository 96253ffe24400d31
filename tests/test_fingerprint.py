"""The committed fingerprint (results/fingerprint.json) reproduces bit for bit: a short ViT and GPT-2
run in the reproducible CPU mode give the same final weights and loss curve here as on the CPU that
made it (trivial there; on another x86 CPU, the check that the mode pins every code path)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

from horst_sparse import fingerprint
from horst_sparse.analysis.runs import scan
from horst_sparse.cpu_mode import missing_cpu_flags

pytestmark = pytest.mark.skipif(bool(missing_cpu_flags()), reason="the reproducible CPU mode needs AVX2 and FMA")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("fingerprint")
    return scratch, fingerprint.measure(scratch)


def test_the_committed_fingerprint_reproduces_bit_for_bit(measured):
    committed = json.loads(fingerprint.COMMITTED.read_text())
    assert fingerprint.differences(committed, measured[1]) == []
    assert set(committed) >= set(fingerprint.runs())


def test_the_runs_record_the_mode_they_ran_in(measured):
    scratch, runs = measured
    for run in runs.values():
        assert run["machine"]["cpu_mode"]["reproducible"] is True
        assert run["machine"]["cpu_mode"]["aten_capability"] == "AVX2"
    frame = scan([scratch]).frame
    assert set(frame.pipeline) == {"vit", "gpt2"} and frame.reproducible_cpu.all()


def test_a_differing_loss_curve_is_named_by_its_first_step(measured):
    runs = measured[1]
    changed = json.loads(json.dumps(runs))
    step = list(changed["gpt2"]["loss_curve"])[2]
    changed["gpt2"]["loss_curve"][step] = (float.fromhex(changed["gpt2"]["loss_curve"][step]) + 1e-6).hex()
    changed["gpt2"]["loss_curve_sha256"] = "0"
    (line,) = fingerprint.differences(changed, runs)
    assert line.startswith(f"gpt2: the loss first differs at step {step} (")
    assert "reproducible mode" in line


def test_writing_the_fingerprint_refuses_a_dirty_tree(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    (clone / "horst" / "__init__.py").write_text((clone / "horst" / "__init__.py").read_text() + "\n# edited\n")
    done = subprocess.run(
        [sys.executable, "-m", "horst_sparse.fingerprint", "--write"], cwd=clone, capture_output=True, text=True
    )
    assert done.returncode == 1 and done.stderr.startswith("error: the working tree has uncommitted changes")


@pytest.mark.slow  # ~1 min: both runs again, through the command
def test_the_command_compares_with_the_committed_fingerprint():
    done = subprocess.run(
        [sys.executable, "-m", "horst_sparse.fingerprint"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert done.stdout.rstrip().endswith("the same bits as the committed fingerprint")
