"""One-shot pruning of GPT-2 by method and pattern (horst_sparse/gpt2/evaluate.py): the rows
and their labels, Wanda's calibration, 2:4 along Conv1D inputs, the config checks. An
untrained nano GPT-2 (no training needed for these properties)."""

from __future__ import annotations

import pytest
import torch
from conftest import compose_cfg, tiny_overrides
from omegaconf import OmegaConf

import pruning
from horst_sparse.gpt2.config import validate
from horst_sparse.gpt2.data import load_data
from horst_sparse.gpt2.evaluate import calibration_batches, evaluate_lm, one_shot_plan, one_shot_pruning, prune_copy
from horst_sparse.gpt2.model import build_model
from horst_sparse.training.config import ConfigError


def prune_cfg(**changes):
    base = {
        "sparsities": [0.0, 0.5, 0.9],
        "scope": "layerwise",
        "preset": "gpt2",
        "methods": ["magnitude"],
        "patterns": ["unstructured"],
        "calibration_windows": 8,
        "calibration_seed": 0,
    }
    return OmegaConf.create({**base, **changes})


@pytest.fixture(scope="module")
def nano(pydoc_dir):
    cfg = compose_cfg(tiny_overrides(pydoc_dir))
    torch.manual_seed(0)
    data = load_data(cfg.data, context=cfg.model.n_positions, is_main=True)
    model = build_model(cfg.model, vocab_size=data.vocab_size).eval()
    return model, cfg, data.train, data.val


def test_plan_is_dense_once_then_methods_by_patterns():
    plan = one_shot_plan(prune_cfg(methods=["magnitude", "wanda"], patterns=["unstructured", "2:4", "1:4"]))
    assert plan == [
        ("none", "dense", 0.0),
        ("magnitude", "unstructured", 0.5),
        ("magnitude", "unstructured", 0.9),
        ("magnitude", "2:4", 0.5),
        ("magnitude", "1:4", 0.75),
        ("wanda", "unstructured", 0.5),
        ("wanda", "unstructured", 0.9),
        ("wanda", "2:4", 0.5),
        ("wanda", "1:4", 0.75),
    ]
    assert one_shot_plan(prune_cfg(sparsities=[0.5], patterns=["2:4"])) == [("magnitude", "2:4", 0.5)]


def test_results_name_method_pattern_and_keep_the_paper_keys(nano):
    model, cfg, train, val = nano
    evaluate = lambda m: evaluate_lm(m, val, context=32, batch_size=16, device=torch.device("cpu"), max_windows=8)  # noqa: E731
    cfg_prune = prune_cfg(methods=["magnitude", "wanda"], patterns=["unstructured", "2:4"])
    evaluation = one_shot_pruning(model, cfg_prune, evaluate, calibration_tokens=train)
    rows = {r["label"]: r for r in evaluation["results"]}
    assert list(rows) == ["0", "0.5", "0.9", "magnitude@2:4", "wanda@0.5", "wanda@0.9", "wanda@2:4"]
    assert rows["0.5"]["method"] == "magnitude" and rows["0.5"]["pattern"] == "unstructured"
    assert rows["wanda@2:4"] == {
        **rows["wanda@2:4"],
        "method": "wanda",
        "pattern": "2:4",
        "sparsity": 0.5,
        "measured_sparsity": 0.5,
        "comparison": "per group of 4 consecutive inputs",
    }
    assert rows["wanda@0.5"]["comparison"] == "per output row" and rows["0.5"]["comparison"] == "layerwise"
    assert evaluation["calibration"] == {
        "split": "train",
        "windows": 8,
        "context": 32,
        "tokens": 256,
        "seed": 0,
        "activations": "of the dense model, one pass",
    }
    assert rows["0"]["ppl"] == pytest.approx(evaluate(model)["ppl"], rel=1e-12)
    assert len({r["ppl"] for r in rows.values()}) == len(rows)  # every row is a different model


def test_two_of_four_along_the_inputs_of_every_conv1d(nano):
    model, cfg, train, _ = nano
    from horst_sparse.gpt2.evaluate import input_norms

    weights = pruning.prunable_parameters(model, "gpt2")
    norms = input_norms(model, weights, calibration_batches(train, context=32, windows=4, seed=0))
    for method in ("magnitude", "wanda"):
        pruned = prune_copy(model, preset="gpt2", method=method, pattern="2:4", sparsity=0.5, norms=norms)
        for name, weight in pruning.prunable_parameters(pruned, "gpt2").items():
            groups = weight.view(-1, 4, weight.shape[1])  # Conv1D [in, out]: groups of 4 consecutive inputs
            assert ((groups != 0).sum(1) == 2).all(), name
    assert all(p.abs().sum() > 0 for p in weights.values())  # the trained model itself is untouched


def test_calibration_windows_are_fixed_by_their_seed(nano):
    _, _, train, _ = nano
    a = calibration_batches(train, context=32, windows=10, seed=3, batch_size=4)
    b = calibration_batches(train, context=32, windows=10, seed=3, batch_size=4)
    assert [t.shape for t in a] == [(4, 32), (4, 32), (2, 32)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], calibration_batches(train, context=32, windows=10, seed=4)[0][:4])


@pytest.mark.parametrize(
    "override, message",
    [
        ("prune.methods=[obd]", "prune.methods has 'obd'"),
        ("prune.patterns=[2:3]", "groups of 3 must tile model.n_embd"),
        ("prune.patterns=[4:2]", "0 < n < m"),
        ("prune.methods=[]", "prune.methods is empty"),
        ("prune.calibration_windows=0", "calibration_windows=0 must be positive"),
        ("export.sparsity=1.0", "export.sparsity=1.0"),
    ],
)
def test_bad_pruning_settings_are_one_line_config_errors(pydoc_dir, override, message):
    extra = ["prune.methods=[wanda]"] if "calibration" in override else []
    cfg = compose_cfg(tiny_overrides(pydoc_dir, override, *extra))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        validate(cfg, world_size=1)
