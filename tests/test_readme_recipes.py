"""The README's "To add" recipes, followed once each in a copy of configs/: a new optimizer and a
new recipe compose, pass the pipeline's checks and build (an arm of the study:
tests/test_embedded_study.py); and every path its code map names exists."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch
import yaml
from omegaconf import OmegaConf

from horst_sparse.compose import compose
from horst_sparse.pipeline import get
from horst_sparse.training.optim import build_optimizer
from horst_sparse.vit.config import validate

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _compose(config_dir, overrides):
    return compose(get("vit"), overrides, config_dir=config_dir)


def test_adding_an_optimizer_is_its_yaml_and_a_line_in_each_tuned_index(tmp_path):
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    (configs / "optimizer" / "adam.yaml").write_text(
        "_target_: torch.optim.Adam\n_partial_: true\nname: adam\nbetas: [0.9, 0.99]\neps: 1.0e-8\nweight_decay: 0.0\n"
    )
    for index in configs.glob("tuned/*/*.yaml"):  # the untuned run at AdamW's schedule
        index.write_text(index.read_text() + "adam: ${.adamw}\n")
    cfg = _compose(configs, ["optimizer=adam"])
    validate(cfg, world_size=1)
    optimizer = build_optimizer(cfg.optimizer, torch.nn.Linear(3, 2), lr=cfg.train.base_lr)
    assert type(optimizer) is torch.optim.Adam and optimizer.defaults["betas"] == (0.9, 0.99)
    assert cfg.train.base_lr == OmegaConf.load(configs / "tuned/vit/digits.yaml").adamw.base_lr


def test_adding_a_recipe_is_its_yaml_and_its_tuned_file(tmp_path):
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    recipe = (configs / "vit_recipe" / "digits.yaml").read_text()
    (configs / "vit_recipe" / "digits_long.yaml").write_text(
        recipe.replace("/tuned/vit@tuned: digits", "/tuned/vit@tuned: digits_long").replace(
            "  epochs: 40", "  epochs: 80"
        )
    )
    shutil.copy(configs / "tuned" / "vit" / "digits.yaml", configs / "tuned" / "vit" / "digits_long.yaml")
    with open(configs / "tuned" / "vit" / "digits_long.yaml") as f:
        horst = yaml.safe_load(f)["horst"]
    cfg = _compose(
        configs,
        [
            "vit_recipe=digits_long",
            "optimizer=horst",
            "acdc.dense_warmup=8",
            "acdc.final_compressed=12",
            "acdc.final_decompressed=8",
            "acdc.compressed=4",
            "acdc.decompressed=4",
        ],
    )
    validate(cfg, world_size=1)
    assert cfg.train.epochs == 80 and cfg.optimizer.alpha == horst["alpha"] and cfg.optimizer.beta == horst["beta"]


def test_every_path_the_code_map_names_exists():
    readme = (CONFIGS.parent / "README.md").read_text()
    table = readme[readme.index("## Code map") : readme.index("To add")]
    paths = [
        p for cell in re.findall(r"^\| `([^|]*)\|", table, re.M) for p in re.findall(r"`?([\w/.]+\.py|[\w/]+/)`?", cell)
    ]
    for folder in (
        "horst_sparse/training/",
        "horst_sparse/analysis/",
        "horst_sparse/study/",
    ):  # the files each row names
        paths += [
            folder + name for name in re.findall(r"`(\w+\.py)`", table.split(f"| `{folder}` |")[1].split("\n")[0])
        ]
    assert len(paths) > 10
    missing = [p for p in paths if not (CONFIGS.parent / p).exists()]
    assert not missing, missing
