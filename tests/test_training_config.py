"""Config composition and validation: typos and bad values fail before any work, one error each."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from horst_sparse.compose import ComposeError, compose
from horst_sparse.gpt2.config import validate
from horst_sparse.paths import CONFIGS
from horst_sparse.pipeline import get
from horst_sparse.training.config import ConfigError


def _compose(*overrides):
    return compose(get("gpt2"), overrides)


def test_defaults_compose_and_validate():
    cfg = _compose()
    validate(cfg, world_size=1)
    assert cfg.optimizer.name == "horst" and cfg.optimizer.betas == [0.9, 0.95]


def test_paper_experiment():
    cfg = _compose("experiment=gpt2_small_slimpajama", "optimizer=adamw")
    validate(cfg, world_size=8)
    assert (cfg.model.n_layer, cfg.model.n_embd, cfg.model.n_head, cfg.model.n_positions) == (12, 768, 12, 1024)
    assert cfg.train.max_steps * cfg.train.batch_size * cfg.model.n_positions == pytest.approx(2.5e9, rel=0.01)
    assert cfg.data.name == "slimpajama" and cfg.optimizer.name == "adamw"


@pytest.mark.parametrize(
    "override,message",
    [
        ("train.lr=-0.1", "train.lr=-0.1 must be positive"),
        ("prune.sparsities=[0.5,1.0]", r"prune.sparsities has 1.0: every sparsity must be in \[0, 1\)"),
        ("optimizer.alpha=-1", r"optimizer=horst \(horst.HORST\): .*alpha"),
        ("+optimizer.alhpa=3", r"optimizer=horst \(horst.HORST\): .*alhpa"),
        (
            "optimizer=adamw optimizer._target_=torch.optim.Adamw",
            "optimizer._target_=torch.optim.Adamw: Error locating target",
        ),
        ("model.arch=vit", "model=gpt2_tiny is not a GPT-2 preset"),
        ("optimizer.betas=[0.9,1.5]", r"optimizer=horst \(horst.HORST\): .*beta"),
        ("optimizer.order=xy", r"optimizer=horst \(horst.HORST\): .*order"),
        ("optimizer.hyperbolic_params=some", "optimizer.hyperbolic_params='some' is unknown; use all_2d or prunable"),
        ("+train.max_step=5", r"train.max_step is not a setting; did you mean train.max_steps\?"),
        ("+model.n_lyer=3", r"model.n_lyer is not a setting; did you mean model.n_layer\?"),
        ("+prune.sparsity=0.5", r"prune.sparsity is not a setting; did you mean prune.sparsities\?"),
        ("train.batch_size=12", "train.batch_size=12 must be a positive multiple of train.micro_batch_size=8"),
        ("logging.mode=sometimes", "logging.mode='sometimes' is unknown"),
    ],
)
def test_bad_values_are_one_clear_error(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(_compose(*override.split()), world_size=1)


@pytest.mark.parametrize("override", ["optimizer.alhpa=3", "train.lr=fast", "model=no_such_model"])
def test_typos_fail_at_composition(override):
    with pytest.raises(ComposeError):
        _compose(override)


def test_typo_in_an_experiment_file_fails_before_any_work(tmp_path):
    """The optimizer node is the class's keyword arguments: the class itself refuses the typo."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "typo.yaml").write_text("# @package _global_\noptimizer:\n  alhpa: 3.0\n")
    with pytest.raises(ConfigError, match="optimizer=horst .*alhpa"):
        validate(_compose(f"hydra.searchpath=[file://{tmp_path}]", "experiment=typo"), world_size=1)


@pytest.mark.parametrize("optimizer", ["horst", "ham"])
def test_alpha_beta_picks_apply_to_the_embedded_recipe_only(optimizer):
    """configs/tuned/gpt2/pydoc/<optimizer>.yaml holds the embedded benchmark's picks
    (scripts/tune.py, results/tuning/); the paper's setting keeps the published (HAM) and library
    (HORST) values, which a 2M-parameter tuning does not transfer to. Where each value comes
    from: tests/test_config_precedence.py."""
    picked = OmegaConf.load(CONFIGS / "tuned" / "gpt2" / "pydoc" / f"{optimizer}.yaml")
    paper_values = OmegaConf.load(CONFIGS / "tuned" / "gpt2" / "slimpajama" / f"{optimizer}.yaml")
    cfg = _compose(f"optimizer={optimizer}")
    assert (cfg.optimizer.alpha, cfg.optimizer.beta) == (picked.alpha, picked.beta)
    paper = _compose(f"optimizer={optimizer}", "experiment=gpt2_small_slimpajama")
    assert (paper.optimizer.alpha, paper.optimizer.beta) == (paper_values.alpha, paper_values.beta)
    assert paper.optimizer.betas == [0.9, 0.95] and paper.optimizer.weight_decay == 0.1  # GPT-2's AdamW recipe
