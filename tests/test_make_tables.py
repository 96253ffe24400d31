"""scripts/make_tables.py on run folders written here in the pipelines' summary.json formats:
mean ± std over seeds, the paper's numbers beside ours, CSV/LaTeX/markdown, the figures."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_tables.py"
_spec = importlib.util.spec_from_file_location("make_tables", SCRIPT)
make_tables = importlib.util.module_from_spec(_spec)
sys.modules["make_tables"] = make_tables  # dataclasses look their module up by name
_spec.loader.exec_module(make_tables)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SPARSITIES = [0.0, 0.5, 0.9]


def optimizer(name: str, **extra) -> dict:
    opt = {"name": name, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.05, "lr": 1e-3}
    if name == "ham":
        opt |= {"alpha": 200.0, "beta": 0.001, "hyperbolic_params": "all_2d"}
    if name == "horst":
        opt |= {"alpha": 10.0, "beta": 0.1, "hyperbolic_params": "all_2d", "order": "ms"}
    return opt | extra


def write_vit_run(folder: Path, *, opt: dict, top1: float, seed: int = 0, sparsity: float = 0.9,
                  imagenet: bool = False, histogram_scale: float | None = None) -> Path:  # fmt: skip
    """A run folder as train_vit.py leaves it (summary.json keys of train_vit.run)."""
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
        "train": {"epochs": 40, "steps": 880, "batch_size": 64, "world_size": 1, "device": "cpu",
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


def write_gpt2_run(folder: Path, *, opt: dict, ppl: list[float], seed: int = 0, weight_scale: float | None = None) -> Path:
    """A run folder as train_gpt2.py leaves it; `weight_scale` adds a checkpoint."""
    results = [{"sparsity": s, "measured_sparsity": s, "val_loss": math.log(p), "ppl": p} for s, p in zip(SPARSITIES, ppl)]
    summary = {
        "pipeline": "gpt2",
        "model": {"preset": "gpt2_tiny", "arch": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8, "n_positions": 16,
                  "dropout": 0.0, "tie_word_embeddings": True, "parameters": 1000, "prunable_parameters": 768},
        "optimizer": {**opt, "min_lr": 1e-4, "warmup_steps": 20},
        "data": {"name": "pydoc", "dir": "data/pydoc", "train_tokens": 125114, "val_tokens": 13902},
        "train": {"steps": 150, "batch_size": 8, "context": 128, "tokens_trained": 153600, "final_train_loss": 4.0,
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
    assert "| imagefolder | deit_small | horst (alpha=10, beta=0.1) | 71.00 ± 1.41 [n=2] (70.50) |" in text
    assert "| imagefolder | deit_small | adamw | 65.00 |" in text  # one run: no std, no n; no paper number
    # The paper's HAM number for DeiT-small appears, though we ran no HAM there.
    assert "| imagefolder | deit_small | ham | – (60.06) |" in text
    # Digits: no paper number, and the base/tiny paper rows do not appear (models we did not run).
    assert "| digits | vit_digits | adamw | 93.00 |" in text
    assert "deit_base" not in text
    # The run list keeps the commit's -dirty mark (ViT fixtures are dirty, GPT-2 ones clean).
    assert "seed 1, commit 0123456789ab-dirty" in text and "seed 0, commit 0123456789ab\n" in text


def test_gpt2_table_and_claims(built):
    text, out = built
    rows = read_csv(out / "gpt2_pruning.csv")
    assert len(rows) == 9  # 3 optimizers x 3 sparsities
    horst_90 = next(r for r in rows if r["optimizer_name"] == "horst" and float(r["sparsity"]) == 0.9)
    assert float(horst_90["mean"]) == 40.0 and horst_90["n"] == "1" and horst_90["paper"] == ""
    assert "| pydoc | gpt2_tiny | horst (alpha=10, beta=0.1) | 30.00 | 30.50 | 40.00 |" in text
    assert "| 0 % | 50 % | 90 % |" in text
    lines = [line for line in text.splitlines() if line.startswith("- gpt2_pruning pydoc")]
    assert len(lines) == 2  # HORST vs AdamW, HORST vs HAM
    assert "better than adamw at 3 of 3 sparsities" in lines[0] and "90 %: +12.00" in lines[0]
    assert "the gap widens" in lines[0]
    vit = [line for line in text.splitlines() if line.startswith("- vit_acdc imagefolder")]
    assert len(vit) == 1 and "better than adamw at 1 of 1" in vit[0] and "+6.00" in vit[0]


def test_latex_and_figures(built):
    _, out = built
    tex = (out / "vit_acdc.tex").read_text()
    assert r"\begin{tabular}{lllr}" in tex and r"\toprule" in tex and r"\bottomrule" in tex
    assert r"71.00 $\pm$ 1.41 [n=2] (70.50)" in tex
    assert r"deit\_small" in tex and r"90 \%" in tex
    assert r"-- (60.06)" in tex
    gpt2_tex = (out / "gpt2_pruning.tex").read_text()
    assert r"horst (alpha=10, beta=0.1) & 30.00 & 30.50 & 40.00 \\" in gpt2_tex
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
    assert "| horst (alpha=10, beta=0.1) [optimizer.lr=0.001] | 30.00 |" in text
    assert "| horst (alpha=10, beta=0.1) [optimizer.lr=0.003] | 20.00 |" in text
    assert "[n=2]" not in text


def test_no_summary_is_a_clear_error(tmp_path: Path, capsys):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(SystemExit) as exit_info:
        make_tables.main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")])
    assert "no summary.json found under" in str(exit_info.value) and "empty" in str(exit_info.value)
    with pytest.raises(SystemExit) as exit_info:
        make_tables.main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    assert "no such folder" in str(exit_info.value)
    assert not (tmp_path / "out").exists()
