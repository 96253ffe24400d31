"""Exported models load with the libraries' own loaders and give the run's numbers:
GPT-2 -> transformers folder (end-of-run switch and horst-sparse export), ViT -> timm
safetensors. Real tiny runs, real loaders, offline."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch
from conftest import HORST_SPARSE, _subprocess_env, compose_cfg, deit_overrides, tiny_overrides
from conftest import _compose as compose_vit_cfg

import pruning
from horst_sparse.gpt2.data import gpt2_tokenizer, load_data
from horst_sparse.gpt2.evaluate import evaluate_lm
from horst_sparse.training import export as horst_export  # horst-sparse export (horst-sparse export)

export_run = horst_export.export_run


@pytest.fixture(scope="module")
def gpt2_run(pydoc_dir, tmp_path_factory):
    """A tiny GPT-2 run evaluating magnitude and Wanda, unstructured and 2:4, exporting Wanda 2:4."""
    from horst_sparse.gpt2.run import run

    run_dir = tmp_path_factory.mktemp("gpt2_run")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    overrides = tiny_overrides(
        pydoc_dir,
        "prune.methods=[magnitude,wanda]",
        "prune.patterns=[unstructured,2:4]",
        "prune.calibration_windows=8",
        "export.enabled=true",
        "export.method=wanda",
        "export.pattern=2:4",
        "logging.mode=disabled",
    )
    summary = run(compose_cfg(overrides), run_dir=run_dir)
    torch.set_num_threads(threads)
    return summary, run_dir, load_data(compose_cfg(overrides).data, context=32, is_main=True).val


def loaded_ppl(folder, val) -> tuple[float, torch.nn.Module]:
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder)
    result = evaluate_lm(model, val, context=32, batch_size=16, device=torch.device("cpu"), max_windows=64)
    return result["ppl"], model


def test_end_of_run_export_loads_with_transformers_and_gives_the_runs_perplexity(gpt2_run):
    summary, run_dir, val = gpt2_run
    folder = run_dir / "export"
    ppl, model = loaded_ppl(folder, val)
    assert ppl == pytest.approx(summary["ppl"]["wanda@2:4"], rel=1e-4)
    for name, weight in pruning.prunable_parameters(model, "gpt2").items():  # 2:4 along Conv1D inputs, exact zeros
        assert ((weight.view(-1, 4, weight.shape[1]) != 0).sum(1) == 2).all(), name
    card = (folder / "README.md").read_text()
    for fact in ("wanda", "2:4", "horst", "pydoc", "measured 0.5000", f"{summary['ppl']['wanda@2:4']:.2f}", "commit"):
        assert fact in card, fact
    assert (folder / "model.safetensors").is_file()


def test_exported_tokenizer_loads_offline_and_gives_the_runs_token_ids(gpt2_run):
    """The run trained over its corpus's compact vocabulary: the exported tokenizer is GPT-2's
    segmentation in those ids (vocabulary.json maps them back to GPT-2's)."""
    from transformers import AutoTokenizer

    run_dir = gpt2_run[1]
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "export")
    gpt2_ids = json.loads((run_dir / "vocabulary.json").read_text())["gpt2_ids"]
    text = "def f(x):\n    return x <|endoftext|>"
    assert [gpt2_ids[i] for i in tokenizer(text)["input_ids"]] == gpt2_tokenizer()(text)["input_ids"]
    assert tokenizer.eos_token_id == len(gpt2_ids) - 1 == gpt2_run[0]["data"]["vocab_size"] - 1
    assert "compact vocabulary" in (run_dir / "export" / "README.md").read_text()


def test_script_exports_a_run_at_a_sparsity_with_exact_zeros(gpt2_run, tmp_path, capsys):
    summary, run_dir, val = gpt2_run
    out = tmp_path / "magnitude50"
    assert horst_export.main([str(run_dir), str(out), "--sparsity", "0.5", "--to", "hf"]) == 0
    assert "measured sparsity 0.5000" in capsys.readouterr().out
    ppl, model = loaded_ppl(out, val)
    assert ppl == pytest.approx(summary["ppl"]["0.5"], rel=1e-4)
    stats = pruning.sparsity_stats(pruning.prunable_parameters(model, "gpt2"))
    assert stats["overall"] == 0.5
    # A sparsity the run did not evaluate is evaluated at export, on the run's validation windows.
    facts = export_run(run_dir, tmp_path / "magnitude70", to="hf", sparsity=0.7)
    assert facts["source"] == "evaluated at export"
    assert loaded_ppl(tmp_path / "magnitude70", val)[0] == pytest.approx(facts["ppl"], rel=1e-4)


def test_script_refuses_the_wrong_format_and_a_missing_sparsity_in_one_line(gpt2_run, tmp_path, capsys):
    run_dir = str(gpt2_run[1])
    assert horst_export.main([run_dir, str(tmp_path / "a"), "--to", "timm"]) == 2
    assert "is a gpt2 run: export it with --to hf" in capsys.readouterr().err
    assert horst_export.main([run_dir, str(tmp_path / "b"), "--to", "hf"]) == 2
    assert "needs --sparsity" in capsys.readouterr().err
    assert horst_export.main([str(tmp_path), str(tmp_path / "c"), "--to", "hf"]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_export_refuses_a_folder_that_holds_files_unless_forced(gpt2_run, tmp_path, capsys):
    """An export never writes over files silently: a folder that holds files needs --force."""
    import subprocess

    run_dir = str(gpt2_run[1])
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("someone's")
    command = [
        HORST_SPARSE,
        "export",
        run_dir,
        str(out),
        "--to",
        "hf",
        "--sparsity",
        "0.5",
    ]
    done = subprocess.run(command, env=_subprocess_env(), capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr.strip()) == (
        2,
        f"error: {out} exists and is not empty; choose a new folder, or pass --force to write over it",
    )
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert horst_export.main([*command[2:], "--force"]) == 0
    assert (out / "model.safetensors").is_file() and (out / "notes.txt").read_text() == "someone's"
    (tmp_path / "empty").mkdir()  # an empty folder (mkdir -p, mktemp -d) is taken as it is
    assert horst_export.main([run_dir, str(tmp_path / "empty"), "--to", "hf", "--sparsity", "0.5"]) == 0
    capsys.readouterr()


@pytest.fixture(scope="module")
def vit_run(imagenet_root, tmp_path_factory):
    from horst_sparse.vit.run import run

    run_dir = tmp_path_factory.mktemp("vit_run")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HORST_FUSED", "0")
        summary = run(compose_vit_cfg(deit_overrides(imagenet_root, "logging.mode=disabled")), run_dir=run_dir)
    torch.set_num_threads(threads)
    return summary, run_dir


def test_vit_export_loaded_the_timm_way_gives_the_runs_accuracy(vit_run, tmp_path):
    """timm.create_model + resolve_data_config + create_transform, nothing of this repository's
    but the validation images: the export's preprocessing is the run's eval transform."""
    import timm
    from timm.data import create_transform, resolve_data_config

    from horst_sparse.vit.data import build_datasets, build_transforms, eval_loader
    from horst_sparse.vit.model import evaluate

    summary, run_dir = vit_run
    out = tmp_path / "vit"
    facts = export_run(run_dir, out, to="timm")
    model = timm.create_model(f"local-dir:{out}", pretrained=True)
    transform = create_transform(**resolve_data_config(model=model))
    cfg = compose_vit_cfg(deit_overrides(summary["data"]["root"]))
    _, run_transform = build_transforms(cfg.aug, img_size=cfg.model.img_size)
    assert repr(transform) == repr(run_transform)
    val_set = build_datasets(cfg.data, cfg.aug, img_size=cfg.model.img_size).val
    val_set.transform = transform
    loader = eval_loader(val_set, batch_size=8, rank=0, world_size=1, num_workers=0, pin_memory=False)
    result = evaluate(model, loader, device=torch.device("cpu"), dtype=torch.float32)
    assert result["top1"] == pytest.approx(summary["top1"], rel=1e-4) and result["top5"] == pytest.approx(
        summary["top5"], rel=1e-4
    )
    assert result["loss"] == pytest.approx(summary["epochs"][-1]["val_loss"], rel=1e-4)  # sharper than this easy top-1
    weights = pruning.prunable_parameters(model, "vit")
    assert pruning.sparsity_stats(weights)["overall"] == summary["measured_sparsity"] == facts["measured_sparsity"]
    # The other timm way: the architecture by name, the file as an overlay.
    m = cfg.model
    by_name = timm.create_model(
        m.timm_name,
        pretrained=True,
        num_classes=3,
        img_size=m.img_size,
        patch_size=m.patch_size,
        embed_dim=m.embed_dim,
        depth=m.depth,
        num_heads=m.num_heads,
        pretrained_cfg_overlay=dict(file=str(out / "model.safetensors"), num_classes=3),
    )
    assert all(torch.equal(a, b) for a, b in zip(by_name.state_dict().values(), model.state_dict().values()))
    card = (out / "README.md").read_text()
    assert f"top-1 {summary['top1']:.4f}" in card and "AC/DC" in card and summary["optimizer"]["name"] in card
    config = json.loads((out / "config.json").read_text())
    assert config["num_classes"] == 3 and config["pretrained_cfg"]["crop_pct"] == cfg.aug.crop_pct


def modes(folder) -> dict[str, int]:
    return {f.name: stat.S_IMODE(f.stat().st_mode) for f in folder.iterdir() if f.is_file()}


def test_every_exported_file_gets_the_mode_a_new_file_gets(gpt2_run, vit_run, tmp_path):
    """0666 less the umask, as open() gives: 0644 under umask 022, model.safetensors too (safetensors
    itself writes 0600); 0640 under 027 (the umask decides, not a fixed mode); the end-of-run
    export as the run's own files."""
    previous = os.umask(0o022)
    try:
        export_run(gpt2_run[1], tmp_path / "gpt2", to="hf", sparsity=0.5)
        export_run(vit_run[1], tmp_path / "vit", to="timm")
        os.umask(0o027)
        export_run(vit_run[1], tmp_path / "vit027", to="timm")
    finally:
        os.umask(previous)
    for folder, mode in (("gpt2", 0o644), ("vit", 0o644), ("vit027", 0o640)):
        found = modes(tmp_path / folder)
        assert "model.safetensors" in found and "README.md" in found and "config.json" in found, found
        assert {name: oct(m) for name, m in found.items() if m != mode} == {}, folder
    run_dir = gpt2_run[1]
    written = stat.S_IMODE((run_dir / "summary.json").stat().st_mode)  # the run's own file, by open()
    assert {name: oct(m) for name, m in modes(run_dir / "export").items() if m != written} == {}


def test_the_shared_export_knows_no_pipeline():
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[1] / "horst_sparse" / "training" / "export.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert not any(name.startswith(("horst_sparse.gpt2", "horst_sparse.vit")) for name in imported), imported


def test_vit_export_refuses_a_sparsity(vit_run, tmp_path):
    from horst_sparse.training.config import RunError

    with pytest.raises(RunError, match="already sparse"):
        export_run(vit_run[1], tmp_path / "x", to="timm", sparsity=0.5)


def test_vit_export_config_keeps_none_of_timms_pretrained_weights_facts(vit_run, tmp_path):
    """timm's pretrained_cfg of the architecture names its published weights (`tag: fb_in1k`, a DeiT's;
    `augreg_in21k_ft_in1k`, a ViT's) and their licence: they describe timm's weights, not the run's."""
    import timm

    from horst_sparse.vit.export import TIMM_WEIGHTS_FIELDS

    out = tmp_path / "vit"
    export_run(vit_run[1], out, to="timm")
    pretrained_cfg = json.loads((out / "config.json").read_text())["pretrained_cfg"]
    assert not set(TIMM_WEIGHTS_FIELDS) & set(pretrained_cfg), pretrained_cfg
    assert {"tag", "license"} <= set(TIMM_WEIGHTS_FIELDS)
    model = timm.create_model(f"local-dir:{out}", pretrained=True)  # still loads the timm way
    assert model.pretrained_cfg.get("tag") is None and model.pretrained_cfg.get("license") is None
