"""scripts/embedded_study.py: its plan, that every multirun command composes, and a real
tiny study (two pipelines, real Hydra multiruns in subprocesses) that resumes, reports
progress, lists a failed cell, and writes runs.csv, the report and the README."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("embedded_study", REPO / "scripts" / "embedded_study.py")
study = importlib.util.module_from_spec(_spec)
sys.modules["embedded_study"] = study  # dataclasses look their module up by name
_spec.loader.exec_module(study)

TINY_VIT = ("train.epochs=4", "train.warmup_epochs=1", "acdc.dense_warmup=1", "acdc.compressed=1", "acdc.decompressed=1",
            "acdc.final_decompressed=1", "acdc.final_compressed=1")  # fmt: skip
TINY_GPT2 = ("model=gpt2_nano", "train.max_steps=4", "train.warmup_steps=1", "train.batch_size=2", "train.micro_batch_size=2",
             "train.eval_interval=0", "eval.max_windows=8", "prune.sparsities=[0.0,0.5,0.9]", "prune.calibration_windows=2")  # fmt: skip


def test_plan_of_the_study_and_of_the_demo():
    groups = study.plan(study.STUDY["optimizers"], study.STUDY["sparsities"], ablations=True)
    names = [g.name for g in groups]
    assert names[:6] == ["gpt2/adamw", "gpt2/ham", "gpt2/horst", "gpt2/horst_sm", "gpt2/horst_prunable",
                         "gpt2/adamw_decay"]  # the long runs first
    assert "vit/horst_sm/s0.98" in names and "vit/horst_reset/s0.9" in names and "gpt2/horst_prunable" in names
    assert {"vit/adamw_decay/s0.9", "vit/adamw_decay/s0.995", "gpt2/adamw_decay"} <= set(names)
    assert len(groups) == 4 + 4 * 6 + 2 + 3
    demo = study.plan(study.DEMO["optimizers"], study.DEMO["sparsities"], ablations=False)
    assert len(demo) == 3 + 3 * 6 and not any("horst_sm" in g.name or "reset" in g.name for g in demo)


def test_command_of_a_group(tmp_path: Path):
    group = study.Group("vit", "horst_sm", study.VARIANTS["horst_sm"], 0.95)
    command = group.command(tmp_path / "runs", [2, 3, 4])
    assert command[:3] == ["python", "train_vit.py", "-m"]
    for override in ("optimizer=horst", "optimizer.order=sm", "acdc.sparsity=0.95", "cpu_threads=1", "seed=2,3,4",
                     f"hydra.sweep.dir={tmp_path / 'runs' / 'vit' / 'horst_sm' / 's0.95'}", "hydra.sweep.subdir=seed${seed}"):  # fmt: skip
        assert override in command, override


def test_the_decay_matched_adamw_shrinks_weights_as_hard_as_horst(tmp_path: Path):
    """`adamw_decay`'s weight decay is weight decay + beta of the pipeline's HORST, as each
    pipeline composes them (tuned values included): retuning HORST must update the control."""
    import plan

    for (pipeline, variant), (overrides, sparsities) in study.ABLATIONS.items():
        if variant != "adamw_decay":
            continue
        entry = plan.load_entry(REPO / study.SCRIPTS[pipeline])
        optimizer = {}
        for name, arguments in (("horst", study.VARIANTS["horst"]), (variant, overrides)):
            group = study.Group(pipeline, name, arguments, sparsities[0])
            _, (cell,) = plan.expand(entry, group.arguments(tmp_path, [0]))
            optimizer[name] = cell.config.optimizer
        assert optimizer[variant].name == "adamw"
        horst = optimizer["horst"]
        assert optimizer[variant].weight_decay == pytest.approx(horst.weight_decay + horst.beta), pipeline


@pytest.mark.slow  # composes 30 configs in subprocesses (~3 min of CPU)
def test_every_planned_command_composes(tmp_path: Path):
    """Hydra accepts every multirun's overrides (`--cfg job` composes, runs nothing)."""
    for group in study.plan(study.STUDY["optimizers"], study.STUDY["sparsities"], ablations=True):
        command = [arg for arg in group.command(tmp_path, [0], python=sys.executable) if arg != "-m"]
        result = subprocess.run([*command, "--cfg", "job"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (group.name, result.stderr[-2000:])


def tiny(monkeypatch) -> None:
    monkeypatch.setitem(study.SETTINGS, "vit", (*study.SETTINGS["vit"], *TINY_VIT))
    monkeypatch.setitem(study.SETTINGS, "gpt2", (*study.SETTINGS["gpt2"], *TINY_GPT2))


def test_tiny_study_runs_and_resumes(tmp_path: Path, monkeypatch, capsys):
    """Two real multiruns of one seed each (tiny settings) side by side, then the same call
    again, which runs nothing and writes the same report, then once more after a setting
    changed, which is refused."""
    tiny(monkeypatch)
    argv = ["--seeds", "1", "--optimizers", "adamw", "--sparsities", "0.9", "--no-ablations", "--runs-dir",
            str(tmp_path / "runs"), "--out", str(tmp_path / "out")]  # fmt: skip
    assert study.main(argv) == 0
    printed = capsys.readouterr().out
    assert "2 of 2 runs to do, in 2 multiruns, 2 at a time" in printed
    assert "gpt2/adamw/seed0: perplexity" in printed and "vit/adamw/s0.9/seed0: top-1" in printed
    table = pd.read_csv(tmp_path / "out" / "runs.csv")
    assert list(table.state) == ["finished", "finished"] and (table.threads == 1).all()
    assert {"claims.md", "paired.md", "pruners.md", "tables.md", "README.md"} <= {p.name for p in (tmp_path / "out").iterdir()}
    report = (tmp_path / "out" / "tables.md").read_text()

    # A run of another plan left in the runs folder (here a copy at a sparsity not asked for,
    # which would also be a second seed-0 run of the same cell) stays out of the report.
    shutil.copytree(tmp_path / "runs" / "vit" / "adamw" / "s0.9", tmp_path / "runs" / "vit" / "adamw" / "s0.8")
    assert study.main(argv) == 0
    assert "0 of 2 runs to do" in capsys.readouterr().out
    assert (tmp_path / "out" / "tables.md").read_text() == report
    assert "none used" not in (tmp_path / "out" / "paired.md").read_text()

    # A finished run made with other settings than the code now composes is refused, named
    # with its differing key, and neither rerun nor reported.
    finished = (tmp_path / "runs" / "gpt2" / "adamw" / "seed0" / "summary.json").stat().st_mtime
    monkeypatch.setitem(study.SETTINGS, "gpt2", (*study.SETTINGS["gpt2"], "train.max_steps=5"))
    assert study.main(argv) == 2
    printed = capsys.readouterr()
    assert "error: 1 finished run(s)" in printed.err and "gpt2/adamw/seed0: train.max_steps: 4 -> 5" in printed.err
    assert "runs to do" not in printed.out
    assert (tmp_path / "runs" / "gpt2" / "adamw" / "seed0" / "summary.json").stat().st_mtime == finished


@pytest.mark.slow  # ~80 s: eight tiny runs in subprocesses
def test_tiny_study_resumes_lists_failures_and_checks(tmp_path: Path, monkeypatch, capsys):
    """Two real multiruns of two seeds each (tiny settings), then the same call again, then
    `--check` on the result and on a tampered runs.csv."""
    tiny(monkeypatch)
    runs, out = tmp_path / "runs", tmp_path / "out"
    argv = ["--seeds", "2", "--optimizers", "adamw", "--sparsities", "0.9", "--no-ablations", "--runs-dir", str(runs),
            "--out", str(out)]  # fmt: skip
    # A cell that failed earlier is reported, not rerun.
    (runs / "vit" / "adamw" / "s0.9" / "seed1").mkdir(parents=True)
    (runs / "vit" / "adamw" / "s0.9" / "seed1" / "failed.json").write_text(json.dumps({"reason": "non-finite loss"}))
    assert study.main(argv) == 1
    printed = capsys.readouterr().out
    assert "3 of 4 runs to do, in 2 multiruns" in printed
    assert "gpt2/adamw/seed0: perplexity" in printed and "vit/adamw/s0.9/seed0: top-1" in printed
    assert "not finished:" in printed and "seed1 (failed)" in printed
    table = pd.read_csv(out / "runs.csv")
    assert list(table.state) == ["finished", "finished", "finished", "failed"]
    assert (table.threads.dropna() == 1).all() and table.top1.notna().sum() == 1 and table.ppl_dense.notna().sum() == 2
    readme = (out / "README.md").read_text()
    assert "python scripts/embedded_study.py --seeds 2" in readme and "| vit/adamw/s0.9 | `python train_vit.py -m" in readme
    assert "every run on 1 torch thread" in readme
    first = (runs / "gpt2" / "adamw" / "seed0" / "summary.json").stat().st_mtime

    assert study.main(argv) == 1  # resumed: nothing left to run but the failed cell, which is not retried
    assert "0 of 4 runs to do" in capsys.readouterr().out
    assert (runs / "gpt2" / "adamw" / "seed0" / "summary.json").stat().st_mtime == first

    # --check reruns a committed cell: identical on this machine; a tampered number is caught.
    monkeypatch.setattr(study, "CHECKED", (("vit", "adamw", 0.9), ("gpt2", "adamw", None)))
    assert study.main([*argv, "--check"]) == 0
    printed = capsys.readouterr().out
    assert printed.count(": identical") == 3 and "vit/adamw/s0.9 seed 0: rerunning" in printed
    table = pd.read_csv(out / "runs.csv")
    table.loc[table.pipeline == "vit", "top1"] += 0.01
    table.to_csv(out / "runs.csv", index=False)
    assert study.main([*argv, "--check"]) == 1
    assert "top1: committed" in (printed := capsys.readouterr().out) and "OUT OF TOLERANCE" in printed


@pytest.mark.slow  # reruns two cells of the committed study at full size (~5 min on 2 cores)
def test_committed_study_cells_rerun_within_tolerance(capsys):
    assert (REPO / "results" / "embedded" / "runs.csv").is_file(), "the study's results are committed"
    assert study.main(["--check"]) == 0, capsys.readouterr().out
