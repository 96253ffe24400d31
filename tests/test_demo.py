"""scripts/demo.py without the runs themselves: its plan of six commands, that they compose as
Hydra configs, and that a failing run stops the demo naming the run and its log."""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("demo", REPO / "scripts" / "demo.py")
demo = importlib.util.module_from_spec(_spec)
sys.modules["demo"] = demo  # dataclasses look their module up by name
_spec.loader.exec_module(demo)


def test_plan_is_both_pipelines_with_each_optimizer(tmp_path: Path):
    runs = demo.plan(tmp_path / "demo", python="python3")
    assert [r.name for r in runs] == ["vit_adamw", "vit_ham", "vit_horst", "gpt2_adamw", "gpt2_ham", "gpt2_horst"]
    for run in runs:
        script = "train_vit.py" if run.pipeline == "vit" else "train_gpt2.py"
        assert run.argv[:4] == ("python3", script, f"optimizer={run.optimizer}", f"hydra.run.dir={tmp_path / 'demo' / run.name}")
        assert run.argv[4:] == tuple(demo.DEMO_OVERRIDES[run.pipeline])
        assert run.run_dir == tmp_path / "demo" / run.name and run.log == tmp_path / "demo" / f"{run.name}.log"
        assert (REPO / script).is_file() and (REPO / "configs" / "optimizer" / f"{run.optimizer}.yaml").is_file()
    inside = demo.plan(REPO / "outputs" / "demo", python="python3")[0]
    assert inside.command == shlex.join(
        ["python", "train_vit.py", "optimizer=adamw", "hydra.run.dir=outputs/demo/vit_adamw", *demo.DEMO_OVERRIDES["vit"]]
    )  # as the README shows it: relative to the repository


@pytest.mark.slow  # imports torch, timm and transformers in a subprocess: ~10 s of CPU each
@pytest.mark.parametrize("pipeline", ["vit", "gpt2"])
def test_planned_commands_compose(pipeline: str, tmp_path: Path):
    """Hydra accepts each command's overrides (--cfg job composes and prints, runs nothing)."""
    run = next(r for r in demo.plan(tmp_path, python=sys.executable) if r.pipeline == pipeline and r.optimizer == "horst")
    result = subprocess.run([*run.argv, "--cfg", "job"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "name: horst" in result.stdout


def test_failed_run_stops_with_its_name_and_log(tmp_path: Path, capsysbinary):
    run = demo.DemoRun(
        "vit_ham", "vit", "ham", (sys.executable, "-c", "print('epoch 3 went wrong'); raise SystemExit(3)"),
        tmp_path / "vit_ham", tmp_path / "vit_ham.log",
    )  # fmt: skip
    with pytest.raises(demo.RunFailed) as error:
        demo.execute(run)
    message = str(error.value)
    assert "vit_ham" in message and "exit code 3" in message and str(run.log) in message
    assert "epoch 3 went wrong" in run.log.read_text()
    assert b"epoch 3 went wrong" in capsysbinary.readouterr().out  # streamed to the terminal too


def test_run_without_summary_is_a_failure(tmp_path: Path):
    run = demo.DemoRun("gpt2_adamw", "gpt2", "adamw", (sys.executable, "-c", "pass"), tmp_path / "r", tmp_path / "r.log")
    with pytest.raises(demo.RunFailed, match="wrote no .*summary.json"):
        demo.execute(run)


def test_successful_run_returns_its_wall_time(tmp_path: Path):
    folder = tmp_path / "r"
    code = f"import pathlib; p = pathlib.Path({str(folder)!r}); p.mkdir(); (p / 'summary.json').write_text('{{}}')"
    run = demo.DemoRun("gpt2_horst", "gpt2", "horst", (sys.executable, "-c", code), folder, tmp_path / "r.log")
    assert 0 < demo.execute(run) < 60


def test_demo_writes_tables_and_readme(tmp_path: Path, monkeypatch):
    """The whole demo with each training run replaced by a folder of a finished run."""
    from test_make_tables import optimizer, write_gpt2_run, write_vit_run

    def finished_run(run):
        if run.pipeline == "vit":
            top1 = {"adamw": 0.9, "ham": 0.91, "horst": 0.95}[run.optimizer]
            write_vit_run(run.run_dir, opt=optimizer(run.optimizer), top1=top1, histogram_scale=0.1)
        else:
            ppl = {"adamw": [33.0, 34.0, 52.0], "ham": [32.0, 33.0, 50.0], "horst": [30.0, 30.5, 40.0]}[run.optimizer]
            write_gpt2_run(run.run_dir, opt=optimizer(run.optimizer), ppl=ppl, weight_scale=0.1)
        return 12.0

    monkeypatch.setattr(demo, "execute", finished_run)
    out = tmp_path / "results"
    (out / "stale.txt").parent.mkdir()
    (out / "stale.txt").write_text("from an earlier demo")
    demo.main(["--runs-dir", str(tmp_path / "runs"), "--out", str(out)])
    readme = (out / "README.md").read_text()
    assert f"gpt2: `{' '.join(demo.DEMO_OVERRIDES['gpt2'])}`" in readme
    command = shlex.join(["python", "train_gpt2.py", "optimizer=horst", f"hydra.run.dir={tmp_path / 'runs' / 'gpt2_horst'}",
                          *demo.DEMO_OVERRIDES["gpt2"]])  # fmt: skip
    assert f"| gpt2_horst | `{command}` | 12 |" in readme
    assert "at commit `" in readme
    assert "Small models on small data" in readme and "8x8 digits (1437 training / 360 validation images)" in readme
    assert "| digits | vit_digits | horst (alpha=10, beta=0.1) | 95.00 |" in readme  # the tables, inline
    assert "better than adamw at 3 of 3 sparsities" in readme
    assert not (out / "stale.txt").exists()
    assert {"vit_acdc.csv", "gpt2_pruning.tex", "weight_distribution.png", "tables.md"} <= {p.name for p in out.iterdir()}
