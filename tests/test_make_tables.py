"""scripts/make_tables.py on run folders written here in the pipelines' formats (config.yaml,
summary.json, failed.json): mean ± std over the seeds of one experiment signature, optimizers
compared only within one, failed and unfinished runs listed, the paper's numbers beside ours,
CSV/LaTeX/markdown, the figures."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_tables.py"
_spec = importlib.util.spec_from_file_location("make_tables", SCRIPT)
make_tables = importlib.util.module_from_spec(_spec)
sys.modules["make_tables"] = make_tables  # dataclasses look their module up by name
_spec.loader.exec_module(make_tables)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SPARSITIES = [0.0, 0.5, 0.9]


TARGETS = {"adamw": "torch.optim.AdamW", "ham": "horst.HAM", "horst": "horst.HORST"}


def optimizer(name: str, **extra) -> dict:
    opt = {"name": name, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.05, "lr": 1e-3}
    if name == "ham":
        opt |= {"alpha": 200.0, "beta": 0.001, "hyperbolic_params": "all_2d"}
    if name == "horst":
        opt |= {"alpha": 10.0, "beta": 0.1, "hyperbolic_params": "all_2d", "order": "ms"}
    return opt | extra


def write_config(folder: Path, config: dict) -> None:
    """config.yaml as the pipelines write it at start-up: the resolved config; the optimizer
    node with `_target_` and `_partial_` beside `name`."""
    opt = config["optimizer"]
    config = {**config, "optimizer": {"_target_": TARGETS[opt["name"]], "_partial_": True, **opt}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def vit_config(*, opt: dict, seed: int = 0, sparsity: float = 0.9, imagenet: bool = False, epochs: int = 40,
               **top: object) -> dict:  # fmt: skip
    """train_vit.py's resolved config (configs/train_vit.yaml's keys)."""
    model = (
        {"arch": "vit", "timm_name": "deit_small_patch16_224", "img_size": 224, "patch_size": 16, "embed_dim": 384,
         "depth": 12, "num_heads": 6, "drop_path": 0.1}
        if imagenet else
        {"arch": "vit", "timm_name": "vit_tiny_patch16_224", "img_size": 8, "patch_size": 2, "embed_dim": 64,
         "depth": 4, "num_heads": 4, "drop_path": 0.1}
    )  # fmt: skip
    return {
        "model": model,
        "optimizer": opt,
        "data": {"name": "imagefolder" if imagenet else "digits", "root": "/data/imagenet" if imagenet else None,
                 "val_fraction": 0.2, "num_workers": 0, "pin_memory": True, "repeated_aug": 1},
        "train": {"epochs": epochs, "batch_size": 64, "base_lr": 1e-3, "base_batch_size": 64, "min_lr": 1e-5,
                  "warmup_lr": 1e-6, "warmup_epochs": 2, "log_interval": 20, "checkpoint_interval": 10},
        "acdc": {"sparsity": sparsity, "scope": "global", "preset": "vit", "patterns": [], "dense_warmup": 4},
        "logging": {"project": "horst-vit", "mode": None, "name": None, "group": None, "tags": []},
        "seed": seed, "device": "auto", "precision": "auto", "deterministic": False, "compile": False,
        "cpu_threads": 1, "resume": "auto",
    } | top  # fmt: skip


def gpt2_config(*, opt: dict, seed: int = 0, steps: int = 150, **top: object) -> dict:
    """train_gpt2.py's resolved config (configs/train_gpt2.yaml's keys)."""
    return {
        "model": {"arch": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8, "n_positions": 16, "dropout": 0.0},
        "optimizer": opt,
        "data": {"name": "pydoc", "dir": "data/pydoc"},
        "train": {"lr": 1e-3, "max_steps": steps, "batch_size": 8, "micro_batch_size": 8, "log_interval": 10},
        "eval": {"batch_size": 16, "max_windows": None},
        "prune": {"sparsities": SPARSITIES, "scope": "layerwise", "preset": "gpt2"},
        "logging": {"project": "horst-gpt2", "mode": None, "name": None, "group": None, "tags": []},
        "seed": seed, "device": "auto", "precision": "auto", "deterministic": False, "compile": False, "resume": "auto",
    } | top  # fmt: skip


def write_failed_run(folder: Path, *, config: dict, pipeline: str, reason: str, exit_code: int = 4,
                     step: int | None = 120) -> Path:  # fmt: skip
    """A run folder a failed run leaves: config.yaml and failed.json (no summary.json)."""
    write_config(folder, config)
    failed = {"pipeline": pipeline, "status": "failed", "exit_code": exit_code, "reason": reason, "step": step,
              "git_commit": "0123456789abcdef", "config": yaml.safe_load((folder / "config.yaml").read_text())}  # fmt: skip
    (folder / "failed.json").write_text(json.dumps(failed))
    return folder


def write_vit_run(folder: Path, *, opt: dict, top1: float, seed: int = 0, sparsity: float = 0.9,
                  imagenet: bool = False, histogram_scale: float | None = None, epochs: int = 40,
                  config: bool | dict = True) -> Path:  # fmt: skip
    """A run folder as train_vit.py leaves it (summary.json keys of train_vit.run), with its
    config.yaml (`config`: True, a dict of top-level keys to change, or False for an older
    folder without one)."""
    model = (
        {"preset": "deit_small", "arch": "vit", "timm_name": "deit_small_patch16_224", "img_size": 224,
         "patch_size": 16, "embed_dim": 384, "depth": 12, "num_heads": 6, "drop_path": 0.1}
        if imagenet else
        {"preset": "vit_digits", "arch": "vit", "timm_name": "vit_tiny_patch16_224", "img_size": 8,
         "patch_size": 2, "embed_dim": 64, "depth": 4, "num_heads": 4, "drop_path": 0.1}
    )  # fmt: skip
    classes = 1000 if imagenet else 10
    summary = {
        "pipeline": "vit",
        "model": {**model, "num_classes": classes, "parameters": 200_000, "prunable_parameters": 196_608},
        "optimizer": {**opt, "base_lr": 1e-3, "base_batch_size": 64, "min_lr": 1e-5, "warmup_lr": 1e-6,
                      "warmup_epochs": 2, "schedule": "linear warm-up, then cosine, per update"},  # fmt: skip
        "data": {"name": "imagefolder" if imagenet else "digits", "root": "/data/imagenet" if imagenet else None,
                 "train_images": 1437, "val_images": 360, "num_classes": classes},  # fmt: skip
        "acdc": {"sparsity": sparsity, "scope": "global", "preset": "vit", "patterns": [], "dense_warmup": 4,
                 "compressed": 2, "decompressed": 2, "final_decompressed": 4, "final_compressed": 6,
                 "reset_second_moment": False, "histogram_bins": 100, "prune_epochs": [4, 8], "restore_epochs": [6]},
        "train": {"epochs": epochs, "steps": 880, "batch_size": 64, "world_size": 1, "device": "cpu",
                  "precision": "float32", "final_train_loss": 0.7, "wall_time_s": 80.0},
        "seed": seed,
        "target_sparsity": sparsity,
        "measured_sparsity": sparsity,
        "top1": top1,
        "top5": 1.0,
        "final_phase": "compressed",
        "accuracy_unit": "fraction of the validation images",
        "per_layer_sparsity": {"blocks.0.attn.qkv.weight": sparsity},
        "epochs": [{"epoch": 39, "phase": "compressed", "top1": top1}],
        "git_commit": "0123456789abcdef-dirty",
        "run_dir": str(folder),
    }  # fmt: skip
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    if config is not False:
        top = config if isinstance(config, dict) else {}
        write_config(folder, vit_config(opt=opt, seed=seed, sparsity=sparsity, imagenet=imagenet, epochs=epochs, **top))
    if histogram_scale is not None:  # as train_vit.run logs them: validation, then histogram, per epoch
        records = []
        for epoch, phase, scale in ((37, "decompressed", 100.0), (38, "decompressed", histogram_scale), (39, "compressed", 100.0)):
            w = torch.randn(4000, generator=torch.Generator().manual_seed(epoch)) * scale
            counts, edges = torch.histogram(w.abs().log10(), bins=20)
            records.append({"step": epoch, "time": 0.0, "val/epoch": epoch, "val/phase": phase, "val/top1": top1})
            records.append({"step": epoch, "time": 0.0, "epoch": epoch, "weights/log10_abs_counts": counts.tolist(),
                            "weights/log10_abs_edges": edges.tolist()})  # fmt: skip
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def write_gpt2_run(folder: Path, *, opt: dict, ppl: list[float], seed: int = 0, weight_scale: float | None = None,
                   steps: int = 150, config: bool | dict = True) -> Path:  # fmt: skip
    """A run folder as train_gpt2.py leaves it; `weight_scale` adds a checkpoint; `config` as
    for write_vit_run."""
    results = [{"sparsity": s, "measured_sparsity": s, "val_loss": math.log(p), "ppl": p} for s, p in zip(SPARSITIES, ppl)]
    summary = {
        "pipeline": "gpt2",
        "model": {"preset": "gpt2_tiny", "arch": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8, "n_positions": 16,
                  "dropout": 0.0, "tie_word_embeddings": True, "parameters": 1000, "prunable_parameters": 768},
        "optimizer": {**opt, "min_lr": 1e-4, "warmup_steps": 20},
        "data": {"name": "pydoc", "dir": "data/pydoc", "train_tokens": 125114, "val_tokens": 13902},
        "train": {"steps": steps, "batch_size": 8, "context": 128, "tokens_trained": 153600, "final_train_loss": 4.0,
                  "wall_time_s": 100.0, "world_size": 1, "device": "cpu"},
        "seed": seed,
        "pruning": {"method": "one-shot magnitude pruning (no retraining)", "scope": "layerwise", "preset": "gpt2",
                    "context": 128, "windows": 109, "tokens": 13901, "results": results},
        "ppl": {f"{s:g}": p for s, p in zip(SPARSITIES, ppl)},
        "git_commit": "0123456789abcdef",
        "run_dir": str(folder),
    }  # fmt: skip
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    if config is not False:
        write_config(folder, gpt2_config(opt=opt, seed=seed, steps=steps, **(config if isinstance(config, dict) else {})))
    if weight_scale is not None:
        g = torch.Generator().manual_seed(0)
        model = {
            "transformer.wte.weight": torch.full((50, 8), 100.0),  # not prunable: must not count
            "transformer.h.0.attn.c_attn.weight": torch.randn(8, 24, generator=g) * weight_scale,
            "transformer.h.0.attn.c_attn.bias": torch.zeros(24),
            "transformer.h.0.mlp.c_fc.weight": torch.randn(8, 32, generator=g) * weight_scale,
        }
        torch.save({"model": model, "step": 150}, folder / "ckpt_00000150.pt")
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    # ViT on ImageNet-1k (paper numbers apply): HORST twice (two seeds of one cell), AdamW once.
    write_vit_run(root / "vit/horst_s0", opt=optimizer("horst"), top1=0.70, seed=0, imagenet=True, histogram_scale=0.01)
    write_vit_run(root / "vit/horst_s1", opt=optimizer("horst"), top1=0.72, seed=1, imagenet=True)
    write_vit_run(root / "vit/adamw_s0", opt=optimizer("adamw"), top1=0.65, seed=0, imagenet=True, histogram_scale=1.0)
    # ViT on digits: never gets paper numbers.
    write_vit_run(root / "digits/adamw", opt=optimizer("adamw"), top1=0.93)
    # GPT-2: HORST lower than AdamW everywhere, the gap widening; HAM without weights.
    write_gpt2_run(root / "gpt2/adamw", opt=optimizer("adamw"), ppl=[33.0, 34.0, 52.0], weight_scale=0.1)
    write_gpt2_run(root / "gpt2/horst", opt=optimizer("horst"), ppl=[30.0, 30.5, 40.0], weight_scale=0.001)
    write_gpt2_run(root / "gpt2/ham", opt=optimizer("ham"), ppl=[32.5, 33.5, 51.0])
    return root


@pytest.fixture(scope="module")
def built(runs: Path, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    text = make_tables.make_tables([runs], out)
    return text, out


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_mean_std_over_seeds_and_paper_column(built):
    text, out = built
    rows = read_csv(out / "vit_acdc.csv")
    horst = [r for r in rows if r["model"] == "deit_small" and r["optimizer_name"] == "horst"]
    assert len(horst) == 1
    cell = horst[0]
    # sample std of 70 and 72: sqrt(((70-71)^2 + (72-71)^2) / (2-1))
    assert float(cell["mean"]) == pytest.approx(71.0)
    assert float(cell["std"]) == pytest.approx(math.sqrt(2.0))
    assert cell["n"] == "2" and cell["seeds"] == "0;1"
    assert float(cell["paper"]) == 70.5  # results/paper/deit_imagenet_acdc.csv: DeiT-small, HORST, 90 %
    adamw = next(r for r in rows if r["model"] == "deit_small" and r["optimizer_name"] == "adamw")
    assert (adamw["mean"], adamw["std"], adamw["n"], adamw["paper"]) == ("65.0", "", "1", "")
    assert "| imagefolder | deit_small | horst (alpha=10, beta=0.1) | 71.00 ± 1.41 (70.50) | 2 |" in text
    assert "| imagefolder | deit_small | adamw | 65.00 | 1 |" in text  # one run: no std; no paper number
    # The paper's HAM number for DeiT-small appears, though we ran no HAM there.
    assert "| imagefolder | deit_small | ham | – (60.06) | – |" in text
    # Digits: no paper number, and the base/tiny paper rows do not appear (models we did not run).
    assert "| digits | vit_digits | adamw | 93.00 | 1 |" in text
    assert "± 0.00" not in text and "setting" not in text  # one experiment per model: no setting column
    assert "deit_base" not in text
    # The run list keeps the commit's -dirty mark (ViT fixtures are dirty, GPT-2 ones clean).
    assert "seed 1, commit 0123456789ab-dirty" in text and "seed 0, commit 0123456789ab\n" in text


def test_gpt2_table_and_claims(built):
    text, out = built
    rows = read_csv(out / "gpt2_pruning.csv")
    assert len(rows) == 9  # 3 optimizers x 3 sparsities
    horst_90 = next(r for r in rows if r["optimizer_name"] == "horst" and float(r["sparsity"]) == 0.9)
    assert float(horst_90["mean"]) == 40.0 and horst_90["n"] == "1" and horst_90["paper"] == ""
    assert "| pydoc | gpt2_tiny | horst (alpha=10, beta=0.1) | 30.00 | 30.50 | 40.00 | 1 |" in text
    assert "| 0 % | 50 % | 90 % | n |" in text
    lines = [line for line in text.splitlines() if line.startswith("- gpt2_pruning pydoc")]
    assert len(lines) == 2  # HORST vs AdamW, HORST vs HAM
    assert "better than adamw at 3 of 3 sparsities" in lines[0] and "90 %: +12.00" in lines[0]
    assert "the gap widens" in lines[0]
    vit = [line for line in text.splitlines() if line.startswith("- vit_acdc imagefolder")]
    assert len(vit) == 1 and "better than adamw at 1 of 1" in vit[0] and "+6.00" in vit[0]


def test_latex_and_figures(built):
    _, out = built
    tex = (out / "vit_acdc.tex").read_text()
    assert r"\begin{tabular}{lllrr}" in tex and r"\toprule" in tex and r"\bottomrule" in tex and r"\centering" in tex
    assert r"71.00 $\pm$ 1.41 (70.50) & 2 \\" in tex
    assert r"deit\_small" in tex and r"90 \%" in tex
    assert r"-- (60.06) & -- \\" in tex
    gpt2_tex = (out / "gpt2_pruning.tex").read_text()
    assert r"horst (alpha=10, beta=0.1) & 30.00 & 30.50 & 40.00 & 1 \\" in gpt2_tex
    for name in ("accuracy_vs_sparsity.png", "perplexity_vs_sparsity.png", "weight_distribution.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC, name
    assert (out / "tables.md").is_file()


def test_weight_histograms_from_metrics_and_checkpoints(built, runs):
    text, _ = built
    notes = [line for line in text.splitlines() if "median |w|" in line]
    # GPT-2 from checkpoints (HAM has none and is left out), ViT ImageNet from metrics.jsonl
    # (AdamW and the HORST seed 0 run, the first with a histogram), digits has none.
    assert len(notes) == 4, notes
    gpt2 = {line.split("gpt2_tiny ")[1].split(":")[0]: line for line in notes if "gpt2_tiny" in line}
    assert set(gpt2) == {"adamw", "horst (alpha=10, beta=0.1)"}
    assert "ckpt_00000150.pt" in gpt2["adamw"]

    def median(line: str) -> float:
        return float(line.split("weights ")[1].split(" ")[0])

    # The non-prunable embedding (|w| = 100) is not counted: medians near 0.67 * scale.
    assert 0.03 < median(gpt2["adamw"]) < 0.15
    assert median(gpt2["horst (alpha=10, beta=0.1)"]) < 0.002
    vit = [line for line in notes if "deit_small" in line]
    # The last dense epoch's histogram (38), not the final sparse model's (39) or an earlier one
    assert len(vit) == 2 and all("metrics.jsonl, epoch 38 (decompressed)" in line for line in vit)
    assert 0.3 < median(next(line for line in vit if "adamw" in line)) < 1.5  # scale 1: median |w| ~0.67
    assert median(next(line for line in vit if "horst" in line)) < 0.015
    assert any("left out of the weight figure" in line and "gpt2/ham" in line for line in text.splitlines())


def test_weight_histogram_file_is_preferred(tmp_path: Path):
    run = write_gpt2_run(tmp_path / "run", opt=optimizer("adamw"), ppl=[1.0, 2.0, 3.0], weight_scale=0.1)
    (run / "weight_histogram.json").write_text(json.dumps({"counts": [1, 3], "edges": [-3.0, -2.0, -1.0]}))
    counts, edges, source = make_tables.weight_histogram(make_tables.find_runs([run])[0])
    assert (counts, edges, source) == ([1, 3], [-3.0, -2.0, -1.0], "weight_histogram.json")


def test_different_settings_are_not_averaged(tmp_path: Path):
    root = tmp_path / "runs"
    write_gpt2_run(root / "a", opt=optimizer("horst"), ppl=[30.0, 31.0, 40.0])
    write_gpt2_run(root / "b", opt=optimizer("horst", lr=3e-3), ppl=[20.0, 21.0, 30.0])
    text = make_tables.make_tables([root], tmp_path / "out")
    assert "| horst (alpha=10, beta=0.1) [optimizer.lr=0.001] | 30.00 | 31.00 | 40.00 | 1 |" in text
    assert "| horst (alpha=10, beta=0.1) [optimizer.lr=0.003] | 20.00 | 21.00 | 30.00 | 1 |" in text
    assert "| 2 |" not in text


def test_no_summary_is_a_clear_error(tmp_path: Path, capsys):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(SystemExit) as exit_info:
        make_tables.main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")])
    assert "no summary.json found under" in str(exit_info.value) and "empty" in str(exit_info.value)
    with pytest.raises(SystemExit) as exit_info:
        make_tables.main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    assert "no such folder" in str(exit_info.value)
    assert not (tmp_path / "out").exists()


def test_runs_of_different_experiments_are_neither_averaged_nor_compared(tmp_path: Path):
    """Issue 14: a 40-epoch HORST run beside a 6-epoch AdamW run, and a 6- and a 40-epoch HORST
    run of seed 0, printed "horst better than adamw ... +22.22" and "87.78 ± 14.93 [2]"."""
    root = tmp_path / "runs"
    write_vit_run(root / "horst_e40", opt=optimizer("horst"), top1=0.98, epochs=40)
    write_vit_run(root / "horst_e6", opt=optimizer("horst"), top1=0.7756, epochs=6)
    write_vit_run(root / "adamw_e6", opt=optimizer("adamw"), top1=0.7578, epochs=6)
    text = make_tables.make_tables([root], tmp_path / "out")
    assert "| data | model | setting | optimizer | 90 % | n |" in text
    assert "| digits | vit_digits | train.epochs=40 | horst (alpha=10, beta=0.1) | 98.00 | 1 |" in text
    assert "| digits | vit_digits | train.epochs=6 | horst (alpha=10, beta=0.1) | 77.56 | 1 |" in text
    assert "| 2 |" not in text and "±" not in text.split("### Experiments")[0].split("Cells:")[1].split("\n", 1)[1]
    assert "vit_acdc digits/vit_digits: 2 experiments, differing in `train.epochs`" in text
    claims = [line for line in text.splitlines() if "better than" in line]
    assert len(claims) == 1 and "[train.epochs=6]" in claims[0] and "+1.78" in claims[0]  # 77.56 - 75.78, not 98 - 75.78
    assert "vit_acdc digits/vit_digits [train.epochs=40]: HORST has no AdamW or HAM run of the same experiment" in text
    rows = read_csv(tmp_path / "out" / "vit_acdc.csv")
    assert [r["setting"] for r in rows] == ["train.epochs=6", "train.epochs=6", "train.epochs=40"]  # 6 before 40


def test_seeds_average_across_excluded_keys_only(tmp_path: Path):
    """Seed, logging, resume, the run folder and the worker/cadence keys do not split a cell;
    any other key (here the device, which sets the precision under precision=auto) does."""
    root = tmp_path / "runs"
    write_gpt2_run(root / "s0", opt=optimizer("horst"), ppl=[30.0, 31.0, 40.0], seed=0)
    write_gpt2_run(root / "s1", opt=optimizer("horst"), ppl=[32.0, 33.0, 42.0], seed=1,
                   config={"logging": {"name": "rerun", "tags": ["x"]}, "resume": "never", "run_dir": "elsewhere"})  # fmt: skip
    write_gpt2_run(root / "s2", opt=optimizer("horst"), ppl=[34.0, 35.0, 44.0], seed=2, config={"device": "cuda"})
    text = make_tables.make_tables([root], tmp_path / "out")
    assert "| pydoc | gpt2_tiny | device=auto | horst (alpha=10, beta=0.1) | 31.00 ± 1.41 | 32.00 ± 1.41 | 41.00 ± 1.41 | 2 |" in text
    assert "| pydoc | gpt2_tiny | device=cuda | horst (alpha=10, beta=0.1) | 34.00 | 35.00 | 44.00 | 1 |" in text
    assert make_tables._excluded("data.num_workers") and make_tables._excluded("logging.name")
    assert not make_tables._excluded("train.epochs") and not make_tables._excluded("optimizer._target_")


def test_failed_and_unfinished_runs_are_listed_not_dropped(tmp_path: Path):
    root = tmp_path / "runs"
    write_vit_run(root / "0_adamw", opt=optimizer("adamw"), top1=0.9)
    write_failed_run(root / "1_horst", config=vit_config(opt=optimizer("horst", alpha=100.0), seed=3), pipeline="vit",
                     reason="non-finite loss (nan) at step 120: lower optimizer.alpha")  # fmt: skip
    write_config(root / "2_ham", vit_config(opt=optimizer("ham")))  # started, never finished
    write_config(root / "0_adamw" / ".hydra", vit_config(opt=optimizer("adamw")))  # Hydra's copy: not a run
    (root / "3_broken").mkdir()
    (root / "3_broken" / "summary.json").write_text("{not json")
    text = make_tables.make_tables([root], tmp_path / "out")
    assert "### Failed runs (1)" in text
    failed = next(line for line in text.splitlines() if line.startswith("| ") and "1_horst" in line)
    assert "horst (alpha=100, beta=0.1)" in failed and "acdc.sparsity=0.9" in failed and "| 3 |" in failed
    assert "non-finite loss (nan) at step 120" in failed and "| 4 | 120 |" in failed
    assert "### Skipped (2)" in text
    assert "2_ham: unfinished: config.yaml but no summary.json or failed.json" in text
    assert "3_broken: summary.json unreadable" in text
    rows = read_csv(tmp_path / "out" / "failed_runs.csv")
    assert len(rows) == 1 and json.loads(rows[0]["signature"])["optimizer.alpha"] == 100.0
    assert "| digits | vit_digits | adamw | 90.00 | 1 |" in text
    # Only failed runs: no table, but the list, not an error
    only = tmp_path / "only"
    write_failed_run(only / "x", config=gpt2_config(opt=optimizer("ham")), pipeline="gpt2", reason="bad config", step=None)
    assert "### Failed runs (1)" in make_tables.make_tables([only], tmp_path / "out2")


def test_folders_without_config_yaml_use_the_summary(tmp_path: Path):
    root = tmp_path / "runs"
    write_vit_run(root / "a", opt=optimizer("horst"), top1=0.90, seed=0, config=False)
    write_vit_run(root / "b", opt=optimizer("horst"), top1=0.92, seed=1, config=False)
    write_vit_run(root / "c", opt=optimizer("horst"), top1=0.50, seed=0, epochs=6, config=False)
    text = make_tables.make_tables([root], tmp_path / "out")
    assert "| digits | vit_digits | train.epochs=40 | horst (alpha=10, beta=0.1) | 91.00 ± 1.41 | 2 |" in text
    assert "| digits | vit_digits | train.epochs=6 | horst (alpha=10, beta=0.1) | 50.00 | 1 |" in text


def test_perplexity_axis_has_plain_tick_labels():
    plt = make_tables._pyplot()
    fig, ax = plt.subplots()
    ax.set_yscale("log")
    make_tables._plain_log_ticks(ax, 180.0, 300.0)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    plt.close(fig)
    assert labels and all(re.fullmatch(r"[0-9.]+", label) for label in labels), labels


def test_run_count_column_per_cell_where_counts_differ():
    import pandas as pd

    assert make_tables._n_text(pd.Series([2, 2, 2]), "–") == "2"
    assert make_tables._n_text(pd.Series([2, 1, float("nan")]), "–") == "2, 1, –"


def test_gpt2_rows_of_the_current_format_and_the_dense_model(tmp_path: Path):
    """train_gpt2.py's results name their method and pattern: the dense model (`none`, `dense`)
    is the 0 % column, Wanda's and 2:4's rows are not the paper's table."""
    run = write_gpt2_run(tmp_path / "runs" / "a", opt=optimizer("adamw"), ppl=[30.0, 31.0, 40.0])
    summary = json.loads((run / "summary.json").read_text())
    dense, *magnitude = summary["pruning"]["results"]
    dense |= {"label": "0", "method": "none", "pattern": "dense"}
    for result in magnitude:
        result |= {"label": f"{result['sparsity']:g}", "method": "magnitude", "pattern": "unstructured"}
    summary["pruning"]["results"] += [
        {"label": "wanda@0.5", "method": "wanda", "pattern": "unstructured", "sparsity": 0.5, "ppl": 1.0},
        {"label": "magnitude@2:4", "method": "magnitude", "pattern": "2:4", "sparsity": 0.5, "ppl": 2.0},
    ]  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    text = make_tables.make_tables([tmp_path / "runs"], tmp_path / "out")
    assert "| data | model | optimizer | 0 % | 50 % | 90 % | n |" in text
    assert "| pydoc | gpt2_tiny | adamw | 30.00 | 31.00 | 40.00 | 1 |" in text


def test_horst_ablation_order_is_not_horst(tmp_path: Path):
    """HORST's order "sm" (S∘M, the paper's ablation) is another method: no HORST paper number
    beside it, no line against the paper's claims about HORST."""
    root = tmp_path / "runs"
    write_vit_run(root / "sm", opt=optimizer("horst", order="sm"), top1=0.80, imagenet=True)
    write_vit_run(root / "adamw", opt=optimizer("adamw"), top1=0.65, imagenet=True)
    text = make_tables.make_tables([root], tmp_path / "out")
    assert "| imagefolder | deit_small | horst-sm (alpha=10, beta=0.1) | 80.00 | 1 |" in text
    assert "| imagefolder | deit_small | horst | – (70.50) | – |" in text  # the paper's HORST: a row of its own
    assert "better than" not in text
    rows = read_csv(tmp_path / "out" / "vit_acdc.csv")
    assert {r["optimizer_name"] for r in rows} == {"adamw", "ham", "horst", "horst-sm"}
