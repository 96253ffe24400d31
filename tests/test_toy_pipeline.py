"""A third pipeline (tests/toy_pipeline, a linear classifier on Gaussian
blobs) is planned, tuned (2 trials), run and tabulated by the shared code, with nothing of it
outside its own package and its own config files (copied into a copy of configs/)."""

from __future__ import annotations

import shutil

import pandas as pd
import yaml
from conftest import CONFIGS
from toy_pipeline import CONFIGS as TOY_CONFIGS
from toy_pipeline import PIPELINE

from horst_sparse import pipeline as registry


def test_a_toy_pipeline_is_planned_tuned_run_and_tabulated(tmp_path, monkeypatch):
    from horst_sparse.analysis.report import write_report
    from horst_sparse.analysis.runs import scan
    from horst_sparse.compose import compose
    from horst_sparse.plan import check, plan
    from horst_sparse.tune import tune

    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    shutil.copytree(TOY_CONFIGS, configs, dirs_exist_ok=True)
    monkeypatch.setattr(registry, "_ADDED", dict(registry._ADDED))  # the registration ends with the test
    registry.register(PIPELINE)
    monkeypatch.chdir(tmp_path)  # anything written to a relative path lands here
    fast = ["device=cpu", "logging.mode=disabled"]

    # plan: 2 optimizers x 2 seeds, each cell composed and checked as its job would start
    costs = tmp_path / "costs.yaml"
    costs.write_text(
        yaml.safe_dump(
            {
                "embedded": {
                    "train_toy": {
                        "gpu_hours": 0,
                        "gpu": "CPU",
                        "cpu_minutes": 0.02,
                        "train.max_steps": 40,
                        "train.batch_size": 32,
                    }
                }
            }
        )
    )
    pipeline, _, cells = plan(
        "train_toy.py", ["optimizer=adamw,horst", "seed=0,1", *fast], costs=costs, config_dir=configs
    )
    assert pipeline is PIPELINE and len(cells) == 4
    assert {(c.config.optimizer.name, c.config.seed) for c in cells} == {
        (o, s) for o in ("adamw", "horst") for s in (0, 1)
    }
    assert all(c.gpu == "CPU" and c.cpu_minutes == 0.02 for c in cells)
    assert check(PIPELINE, cells) == []

    # tune: AdamW, 2 quasi-random trials on the validation split; the pick lands in the toy's tuned file
    values = tune(
        "toy",
        "adamw",
        trials=2,
        overrides=fast,
        commit="0" * 40,
        command="test",
        config_dir=configs,
        results_dir=tmp_path / "results",
        sweep_dir=tmp_path / "sweep",
    )
    written = yaml.safe_load((configs / "tuned" / "toy" / "blobs.yaml").read_text())["adamw"]
    assert written["provenance"]["trials"] == 2 and written["lr"] == values["lr"]
    assert set(written["provenance"]["space"]) == {"train.lr", "optimizer.weight_decay"}
    trials = pd.read_csv(tmp_path / "results" / "toy" / "blobs" / "tuning.csv")
    assert len(trials) == 2 and (trials["eval_split"] == "validation").all() and trials["pick"].sum() == 1

    # run: 2 optimizers x 2 seeds on the test split, AdamW at its new pick
    runs = tmp_path / "runs"
    for optimizer in ("adamw", "horst"):
        for seed in (0, 1):
            cfg = compose(
                PIPELINE, [f"optimizer={optimizer}", f"seed={seed}", "eval_split=test", *fast], config_dir=configs
            )
            if optimizer == "adamw":
                assert cfg.train.lr == values["lr"] and cfg.optimizer.weight_decay == values["weight_decay"]
            summary = PIPELINE.run(cfg, run_dir=runs / f"{optimizer}_seed{seed}")
            assert summary["eval_split"] == "test" and 0 <= summary["numbers"][0]["value"] <= 100
            assert (runs / f"{optimizer}_seed{seed}" / "ckpt_00000040.pt").is_file()

    # tabulate: the results layer reads the toy's numbers without knowing the pipeline
    found = scan([runs], base=tmp_path)
    assert found.left_out == [] and set(found.frame.pipeline) == {"toy"}
    out = tmp_path / "report"
    write_report(found.frame, out, split="test", folders=found.folders)
    toy = pd.read_csv(out / "toy_top1.csv")  # the toy's own table (horst_sparse/analysis/report.py: table_file)
    assert sorted(toy.arm) == ["adamw", "horst"] and (toy.n == 2).all() and (toy.data == "blobs").all()
    tables = (out / "tables.md").read_text()
    assert "### toy: top-1 accuracy (%) of the final model, test split" in tables
    assert "| blobs | toy_linear | adamw |" in tables and "| blobs | toy_linear | horst |" in tables
