"""Magnitude masks against torch.nn.utils.prune, exact counts with ties, validation."""

import math

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import pruning
from pruning import magnitude


def random_weights(shapes, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(shape, generator=generator, dtype=dtype) for i, shape in enumerate(shapes)}


def reference_layerwise(weight, sparsity):
    module = nn.Linear(1, 1, bias=False)
    module.weight = nn.Parameter(weight.clone())
    prune.l1_unstructured(module, "weight", amount=math.floor(sparsity * weight.numel()))
    return module.weight_mask.bool()


def reference_global(weights, sparsity):
    modules = []
    for weight in weights.values():
        module = nn.Linear(1, 1, bias=False)
        module.weight = nn.Parameter(weight.clone())
        modules.append(module)
    total = sum(w.numel() for w in weights.values())
    prune.global_unstructured(
        [(m, "weight") for m in modules],
        pruning_method=prune.L1Unstructured,
        amount=math.floor(sparsity * total),
    )
    return {name: m.weight_mask.bool() for name, m in zip(weights, modules)}


# Sizes on both sides of the sampled-bracket threshold (2**17 entries).
SHAPES = [(7, 13), (64, 96), (300, 500), (500, 300), (3, 4, 5, 6)]


def assert_no_ties(weights):
    flat = torch.cat([w.abs().flatten() for w in weights.values()])
    assert flat.unique().numel() == flat.numel(), "test data must be tie-free"


@pytest.mark.parametrize("sparsity", [0.0, 0.1, 0.5, 0.9, 0.999])
def test_layerwise_equals_l1_unstructured(sparsity):
    weights = random_weights(SHAPES, seed=1, dtype=torch.float64)  # float64: no ties
    assert_no_ties(weights)
    masks = pruning.magnitude_masks(weights, sparsity, scope="layerwise")
    for name, weight in weights.items():
        assert masks[name].dtype == torch.bool and masks[name].shape == weight.shape
        assert torch.equal(masks[name], reference_layerwise(weight, sparsity)), name


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.7, 0.95])
def test_global_equals_global_unstructured(sparsity):
    generator = torch.Generator().manual_seed(2)
    # Different scales per layer, so the global threshold prunes layers unevenly.
    weights = {
        f"w{i}": torch.randn(s, generator=generator, dtype=torch.float64) * (i + 1) for i, s in enumerate(SHAPES)
    }
    assert_no_ties(weights)
    masks = pruning.magnitude_masks(weights, sparsity, scope="global")
    expected = reference_global(weights, sparsity)
    for name in weights:
        assert torch.equal(masks[name], expected[name]), name
    per_layer = [1 - masks[n].float().mean().item() for n in weights]
    if sparsity > 0:
        assert max(per_layer) - min(per_layer) > 0.1  # genuinely global, not layerwise


def test_global_single_threshold():
    weights = random_weights(SHAPES, seed=3)
    masks = pruning.magnitude_masks(weights, 0.6, scope="global")
    kept = torch.cat([w.abs()[masks[n]] for n, w in weights.items()])
    pruned = torch.cat([w.abs()[~masks[n]] for n, w in weights.items()])
    assert pruned.max() <= kept.min()


@pytest.mark.parametrize("scope", ["layerwise", "global"])
@pytest.mark.parametrize("sparsity", [0.25, 0.5, 0.77])
def test_exact_counts_with_ties(scope, sparsity):
    generator = torch.Generator().manual_seed(4)
    # Few distinct magnitudes, both signs, many zeros: almost every threshold is a tie.
    weights = {f"w{i}": torch.randint(-3, 4, shape, generator=generator).float() for i, shape in enumerate(SHAPES)}
    masks = pruning.magnitude_masks(weights, sparsity, scope=scope)
    if scope == "layerwise":
        for name, weight in weights.items():
            assert int((~masks[name]).sum()) == math.floor(sparsity * weight.numel()), name
    else:
        total = sum(w.numel() for w in weights.values())
        assert sum(int((~m).sum()) for m in masks.values()) == math.floor(sparsity * total)
    # Magnitude order still holds: nothing kept is smaller than anything pruned.
    groups = [[n] for n in weights] if scope == "layerwise" else [list(weights)]
    for names in groups:
        kept = torch.cat([weights[n].abs()[masks[n]] for n in names])
        pruned = torch.cat([weights[n].abs()[~masks[n]] for n in names])
        assert pruned.max() <= kept.min()


def test_ties_prune_earliest_first():
    weight = torch.tensor([[1.0, -1.0, 1.0], [2.0, 1.0, -1.0]])  # five ties at |w| = 1
    masks = pruning.magnitude_masks({"w": weight}, 0.5)  # prune 3 of 6
    assert masks["w"].tolist() == [[False, False, False], [True, True, True]]
    first, second = torch.ones(2, 2), torch.ones(2, 2)
    masks = pruning.magnitude_masks({"a": first, "b": second}, 0.75, scope="global")  # prune 6 of 8
    assert masks["a"].sum() == 0 and masks["b"].tolist() == [[False, False], [True, True]]


def test_deterministic_and_input_untouched():
    weights = random_weights(SHAPES, seed=5)
    copies = {n: w.clone() for n, w in weights.items()}
    first = pruning.magnitude_masks(weights, 0.8, scope="global")
    second = pruning.magnitude_masks(weights, 0.8, scope="global")
    assert all(torch.equal(first[n], second[n]) for n in weights)
    assert all(torch.equal(weights[n], copies[n]) for n in weights)


@pytest.mark.parametrize("seed", range(3))
def test_exact_whether_the_sampled_bracket_hits_or_misses(monkeypatch, seed):
    # Negative or zero margins make the bracket miss: the fallback must give the same masks.
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(400, 400, generator=generator, dtype=torch.float64)
    expected = reference_layerwise(weight, 0.6)
    hits = []
    prune_within = magnitude._prune_within

    def recording(*args):
        result = prune_within(*args)
        hits.append(result is not None)
        return result

    monkeypatch.setattr(magnitude, "_prune_within", recording)
    for sigmas, sample_size in [(-3.0, 1 << 15), (0.0, 1 << 15), (0.0, 16), (4.0, 16), (4.0, 1 << 15)]:
        monkeypatch.setattr(magnitude, "_SAMPLE_SIGMAS", sigmas)
        monkeypatch.setattr(magnitude, "_SAMPLE_SIZE", sample_size)
        assert torch.equal(pruning.magnitude_masks({"w": weight}, 0.6)["w"], expected), (sigmas, sample_size)
    assert not all(hits) and any(hits)


def test_structured_large_matrix_matches_reference():
    # Column scales that repeat with the row length: a strided sample must not be fooled.
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(512, 768, generator=generator, dtype=torch.float64) * torch.arange(1, 769).double()
    assert torch.equal(pruning.magnitude_masks({"w": weight}, 0.7)["w"], reference_layerwise(weight, 0.7))


def test_bfloat16_and_mixed_dtypes():
    weights = random_weights([(64, 64), (32, 64)], seed=8)
    weights["w0"] = weights["w0"].bfloat16()
    masks = pruning.magnitude_masks(weights, 0.5, scope="global")
    assert sum(int((~m).sum()) for m in masks.values()) == (64 * 64 + 32 * 64) // 2
    layerwise = pruning.magnitude_masks({"w": weights["w0"]}, 0.5)
    assert int((~layerwise["w"]).sum()) == 64 * 64 // 2


def test_prune_zeroes_in_place_on_parameters():
    layer = nn.Linear(20, 30)
    masks = pruning.prune_({"weight": layer.weight}, 0.4)
    assert layer.weight.requires_grad
    assert int((layer.weight == 0).sum()) == 240 and torch.equal(layer.weight != 0, masks["weight"])


@pytest.mark.parametrize("sparsity", [1.0, 1, -0.1, 1.5, float("nan"), True, "0.5", None])
def test_invalid_sparsity(sparsity):
    with pytest.raises(ValueError, match="sparsity"):
        pruning.magnitude_masks({"w": torch.randn(4, 4)}, sparsity)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="scope"):
        pruning.magnitude_masks({"w": torch.randn(4, 4)}, 0.5, scope="per-row")
    with pytest.raises(ValueError, match="empty"):
        pruning.magnitude_masks({}, 0.5)
    with pytest.raises(ValueError, match="mapping"):
        pruning.magnitude_masks([torch.randn(4, 4)], 0.5)
    with pytest.raises(ValueError, match="floating-point"):
        pruning.magnitude_masks({"w": torch.ones(4, 4, dtype=torch.long)}, 0.5)
