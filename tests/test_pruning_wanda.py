"""Wanda scores and masks against direct formulas and a hand computation, both weight
layouts, the calibration hooks, and the one-shot dispatcher."""

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

import pruning


def test_hand_computation_on_a_tiny_conv1d():
    # Conv1D(nf=2 outputs, nx=3 inputs): weight [in=3, out=2], y = x @ W + b.
    layer = Conv1D(2, 3)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, -4.0], [-2.0, 1.0], [3.0, 0.5]]))
    model = nn.Sequential(layer)
    weights = {"0.weight": layer.weight}
    # Two tokens: input feature norms sqrt(1+9)=sqrt(10), sqrt(4+0)=2, sqrt(0+1)=1.
    x = torch.tensor([[[1.0, 2.0, 0.0], [3.0, 0.0, 1.0]]])
    with pruning.InputNorms(model, weights) as collector:
        model(x)
    norms = collector.norms()["0.weight"]
    assert norms.tolist() == pytest.approx([10**0.5, 2.0, 1.0])
    assert collector.tokens == 2
    scores = pruning.wanda_scores(weights, {"0.weight": norms}, dim=0)["0.weight"]
    # By hand: |W[i, j]| * ||X_i||: output 0: 1*3.162=3.162, 2*2=4, 3*1=3; output 1: 4*3.162=12.65, 1*2=2, 0.5*1=0.5.
    assert torch.allclose(scores, torch.tensor([[10**0.5, 4 * 10**0.5], [4.0, 2.0], [3.0, 0.5]]))
    # 1/3 sparsity: each output (a column of the [in, out] weight) loses its lowest score.
    # Output 0 loses input 2 (score 3, though |w|=3 is its largest weight); output 1 loses input 2.
    mask = pruning.wanda_masks(weights, {"0.weight": norms}, 0.34, dim=0)["0.weight"]
    assert mask.tolist() == [[True, True], [True, True], [False, False]]
    # Magnitude would have removed input 0 of output 0 (|w|=1) instead.
    magnitude = pruning.one_shot_masks(weights, method="magnitude", sparsity=2 / 6 + 1e-9)["0.weight"]
    assert not magnitude[0, 0]


@pytest.mark.parametrize("sparsity", [0.0, 0.25, 0.5, 0.9])
def test_linear_layout_matches_direct_formula(sparsity):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(6, 20, generator=generator)  # [out, in]
    norms = torch.rand(20, generator=generator) + 0.1
    score = weight.abs() * norms[None, :]
    assert torch.equal(pruning.wanda_scores({"w": weight}, {"w": norms})["w"], score)
    mask = pruning.wanda_masks({"w": weight}, {"w": norms}, sparsity)["w"]
    k = int(sparsity * 20)
    for row in range(6):
        pruned = set(score[row].argsort()[:k].tolist())
        assert {j for j in range(20) if not mask[row, j]} == pruned
    assert (mask.sum(1) == 20 - k).all()


def test_conv1d_layout_is_the_transpose_of_linear():
    generator = torch.Generator().manual_seed(1)
    linear = torch.randn(5, 16, generator=generator)
    norms = torch.rand(16, generator=generator)
    linear_mask = pruning.wanda_masks({"w": linear}, {"w": norms}, 0.5)["w"]
    conv1d_mask = pruning.wanda_masks({"w": linear.t().contiguous()}, {"w": norms}, 0.5, dim=0)["w"]
    assert torch.equal(conv1d_mask, linear_mask.t())


def test_ties_prune_earlier_inputs_first():
    weight = torch.ones(1, 4)
    mask = pruning.wanda_masks({"w": weight}, {"w": torch.ones(4)}, 0.5)["w"]
    assert mask.tolist() == [[False, False, True, True]]


def test_input_norms_over_batches_equal_one_pass_and_linear_hooks():
    generator = torch.Generator().manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 4))
    weights = pruning.prunable_parameters(model)
    x = torch.randn(3, 5, 8, generator=generator)
    with pruning.InputNorms(model, weights) as collector:
        model(x[:1])
        model(x[1:])
    norms = collector.norms()
    assert torch.allclose(norms["0.weight"], x.reshape(-1, 8).norm(dim=0))
    hidden = torch.relu(model[0](x)).reshape(-1, 4)
    assert torch.allclose(norms["2.weight"], hidden.norm(dim=0), rtol=1e-5)
    model(x)  # hooks removed on exit: nothing accumulates any more
    assert torch.equal(collector.norms()["0.weight"], norms["0.weight"])


def test_input_norms_without_a_forward_pass_say_so():
    model = nn.Sequential(nn.Linear(4, 4))
    with pruning.InputNorms(model, pruning.prunable_parameters(model)) as collector:
        pass
    with pytest.raises(RuntimeError, match="forward"):
        collector.norms()


def test_wanda_nm_keeps_the_highest_scores_of_each_group():
    weight = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    norms = torch.tensor([0.1, 0.1, 10.0, 10.0])
    mask = pruning.one_shot_masks({"w": weight}, method="wanda", pattern="2:4", input_norms={"w": norms})["w"]
    assert mask.tolist() == [[False, False, True, True]]
    magnitude = pruning.one_shot_masks({"w": weight}, method="magnitude", pattern="2:4")["w"]
    assert magnitude.tolist() == [[True, True, False, False]]


def test_dispatcher_refuses_bad_arguments_by_name():
    weights = {"w": torch.randn(4, 8)}
    with pytest.raises(ValueError, match="input_norms"):
        pruning.one_shot_masks(weights, method="wanda", sparsity=0.5)
    with pytest.raises(ValueError, match="method='obd' is unknown"):
        pruning.one_shot_masks(weights, method="obd", sparsity=0.5)
    with pytest.raises(ValueError, match="quote it"):
        pruning.parse_pattern("124")
    with pytest.raises(ValueError, match="its sparsity is 0.5"):
        pruning.one_shot_masks(weights, pattern="2:4", sparsity=0.9)
    with pytest.raises(ValueError, match="shape"):
        pruning.wanda_scores(weights, {"w": torch.ones(4)})
    assert pruning.parse_pattern("unstructured") is None and pruning.parse_pattern("2:4") == (2, 4)
    assert pruning.pattern_sparsity("1:4") == 0.75 and pruning.pattern_sparsity("unstructured", 0.3) == 0.3
