"""Each entry point knows its own presets: `--help` lists them, and another pipeline's preset
is one line naming the entry point that takes it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

from horst_sparse.training.presets import presets


def entry_point(script: str, *args: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_presets_are_split_by_pipeline():
    gpt2, vit = presets("gpt2"), presets("vit")
    assert gpt2["model"] == ["gpt2_nano", "gpt2_small", "gpt2_tiny"] and "deit_small" in vit["model"]
    arms = ["adamw", "adamw_decay", "ham", "horst", "horst_beta0", "horst_mirror_off", "horst_prunable", "horst_sm"]
    assert gpt2["experiment"] == sorted([*arms, "gpt2_small_slimpajama", "smoke_gpt2"])  # an arm serves both
    assert len(vit["experiment"]) == len(arms) + 10 and set(arms) < set(vit["experiment"])
    assert "smoke_vit" in vit["experiment"] and "smoke_vit" not in gpt2["experiment"]
    assert "vit_sparsity" not in gpt2["+study"] and "gpt2_table" not in vit["+study"]
    assert {"horst_alpha_beta", "ham_alpha_beta"} <= set(gpt2["+study"]) & set(vit["+study"])
    assert gpt2["optimizer"] == vit["optimizer"] and "horst_lion" in gpt2["optimizer"]


def test_help_lists_only_the_pipelines_own_presets():
    text = entry_point("train_gpt2.py", "--help").stdout
    assert "model: gpt2_nano, gpt2_small, gpt2_tiny" in text and "gpt2_recipe: pydoc, slimpajama" in text
    assert "deit" not in text.split("== Config ==")[0] and "schema_" not in text


@pytest.mark.parametrize(
    "script,argument,owner",
    [
        ("train_gpt2.py", "experiment=deit_small_acdc_s90", "train_vit.py"),
        ("train_vit.py", "model=gpt2_tiny", "train_gpt2.py"),
    ],
)
def test_another_pipelines_preset_is_one_line(script, argument, owner):
    result = entry_point(script, argument)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: {argument} is a preset of {owner}; {script} takes {argument.split('=')[0]}="
        + " | ".join(presets("gpt2" if script == "train_gpt2.py" else "vit")[argument.split("=")[0]])
    ]


def test_the_gpu_recipes_ask_for_cuda_and_every_other_run_takes_what_works(compose):
    """A GPU recipe where CUDA does not work stops at start-up (horst_sparse.training.env); the
    embedded defaults and the smoke presets keep device=auto (the CPU there)."""
    import yaml

    experiments = {p.stem: yaml.safe_load(p.read_text()) for p in (ROOT / "configs" / "experiment").glob("*.yaml")}
    gpu = {name for name in experiments if name.startswith("deit_")} | {"gpt2_small_slimpajama"}
    assert {name for name, node in experiments.items() if node.get("device") == "cuda"} == gpu
    assert all("device" not in node for name, node in experiments.items() if name not in gpu)
    assert compose("vit", ["experiment=deit_base_acdc_s90"])["device"] == "cuda"  # the experiment wins
    assert compose("gpt2", ["experiment=gpt2_small_slimpajama"])["device"] == "cuda"
    assert compose("vit", [])["device"] == compose("gpt2", [])["device"] == "auto"
