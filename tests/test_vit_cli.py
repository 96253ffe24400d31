"""train_vit.py / train_gpt2.py as a new user runs them, in real subprocesses whose output is a
pipe (as in a batch job's log): the smoke presets, plain log lines, the run folder that the
same command continues, and one-line errors for misspelt keys and misplaced N:M patterns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def entry_point(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # two runs of the smoke preset (~40 s on 2 idle cores)
def test_vit_smoke_preset_logs_plain_lines_and_the_same_command_continues_its_folder(tmp_path: Path):
    first = entry_point("train_vit.py", "experiment=smoke_vit", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    output = first.stdout + first.stderr
    assert "\r" not in output and "Warning" not in output, output[:2000]  # no bar redraws, no callback warning
    assert (
        "epoch 1 compressed: step 25/64 loss " in first.stdout and "epoch   3   compressed: train loss" in first.stdout
    )
    (folder,) = (tmp_path / "outputs" / "vit").iterdir()
    assert folder.name == "vit_digits_horst_s0.9_seed0_experiment=smoke_vit" and (folder / "summary.json").is_file()
    assert f"run folder: {folder}" in first.stdout

    again = entry_point("train_vit.py", "experiment=smoke_vit", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"{folder} holds this run, finished (summary.json); nothing to do" in again.stdout  # nothing redone
    assert [p.name for p in (tmp_path / "outputs" / "vit").iterdir()] == [folder.name]


@pytest.mark.slow  # a 20-update GPT-2 run (~30 s on 2 cores)
def test_gpt2_smoke_preset_logs_its_train_loss_in_plain_lines(tmp_path: Path):
    result = entry_point("train_gpt2.py", "experiment=smoke_gpt2", "data.dir=" + str(tmp_path / "pydoc"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "\r" not in result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("train: step ")]
    assert [line.split(" loss ")[0] for line in lines] == [f"train: step {s}/20" for s in (5, 10, 15, 20)]
    assert all(float(line.split(" loss ")[1].split()[0]) > 0 for line in lines)


@pytest.mark.parametrize(
    "script,argument,line",
    [
        ("train_vit.py", "train.bse_lr=1e-3", "error: train.bse_lr is not a setting; did you mean train.base_lr?"),
        ("train_gpt2.py", "model.n_embed=64", "error: model.n_embed is not a setting; did you mean model.n_embd?"),
        ("train_vit.py", "sede=1", "error: sede is not a setting; did you mean seed?"),
    ],
)
def test_a_misspelt_key_gets_did_you_mean_first(tmp_path: Path, script, argument, line):
    result = entry_point(script, argument, cwd=tmp_path)
    assert (result.returncode, result.stderr.strip()) == (1, line)


@pytest.mark.slow  # composes and checks a run in a subprocess (~15 s)
def test_an_nm_pattern_in_acdc_patterns_is_one_line_with_the_fix(tmp_path: Path):
    result = entry_point("train_vit.py", 'acdc.patterns=["2:4"]', cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: acdc.patterns has '2:4', but acdc.patterns are module-name regexes added to the prunable set; "
        'for 2:4 masks use acdc.pattern="2:4" acdc.sparsity=0.5'
    )
    assert not (tmp_path / "outputs" / "vit").exists() or not any((tmp_path / "outputs" / "vit").iterdir())
