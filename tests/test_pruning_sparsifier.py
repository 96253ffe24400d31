"""Sparsifier: pruned weights stay exactly 0 under optimizers with momentum and
decoupled weight decay; restore lets them grow back; masks survive a checkpoint."""

import io

import pytest
import torch
from torch import nn

import pruning


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))


def train_steps(model, optimizer, sparsifier, steps, seed=0, hooks=False):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, 16, generator=generator)
        y = torch.randn(32, 8, generator=generator)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        if not hooks:
            sparsifier.mask_grads_()
        optimizer.step()
        if not hooks:
            sparsifier.apply_masks_()


def make_optimizer(name, params):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=0.1)
    horst = pytest.importorskip("horst")
    if name == "horst":
        return horst.HORST(params, lr=1e-2, weight_decay=0.1, alpha=10.0, beta=0.1, fused=False)
    return horst.HAM(params, lr=1e-2, weight_decay=0.1, fused=False)


@pytest.mark.parametrize("optimizer_name", ["adamw", "sgd", "horst", "ham"])
@pytest.mark.parametrize("hooks", [False, True])
def test_pruned_weights_stay_exactly_zero(optimizer_name, hooks):
    model = make_model()
    optimizer = make_optimizer(optimizer_name, model.parameters())
    weights = pruning.prunable_parameters(model, exclude=())
    sparsifier = pruning.Sparsifier(weights)
    if hooks:
        sparsifier.attach(optimizer)
    train_steps(model, optimizer, sparsifier, 5)  # dense: momentum builds up everywhere
    masks = sparsifier.prune(0.7)
    train_steps(model, optimizer, sparsifier, 10, seed=1, hooks=hooks)
    for name, weight in weights.items():
        assert (weight[~masks[name]] == 0).all(), name
        assert (weight[masks[name]] != 0).all(), name
        assert (weight.grad[~masks[name]] == 0).all(), name
    assert pruning.sparsity_stats(weights)["overall"] == pytest.approx(0.7, abs=1e-3)


def test_without_reapplying_adamw_moves_pruned_weights():
    # Why apply_masks_ exists: masked gradients alone do not keep AdamW's zeros.
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sparsifier = pruning.Sparsifier(pruning.prunable_parameters(model, exclude=()))
    train_steps(model, optimizer, sparsifier, 5)
    masks = sparsifier.prune(0.7)
    optimizer.zero_grad()
    model(torch.randn(4, 16)).sum().backward()
    sparsifier.mask_grads_()
    optimizer.step()
    assert (model[0].weight[~masks["0.weight"]] != 0).any()


def test_restore_lets_weights_regrow_and_reprune_recomputes():
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    weights = pruning.prunable_parameters(model, exclude=())
    sparsifier = pruning.Sparsifier(weights)
    first = sparsifier.prune(0.8, scope="layerwise")
    assert sparsifier.is_sparse
    sparsifier.restore()
    assert sparsifier.masks == {} and not sparsifier.is_sparse
    pruned_per_layer = {name: int(0.8 * w.numel()) for name, w in weights.items()}  # floor(s * n)
    assert pruning.sparsity_stats(weights)["zeros"] == sum(pruned_per_layer.values())  # zeros until trained
    train_steps(model, optimizer, sparsifier, 5)
    assert pruning.sparsity_stats(weights)["overall"] == 0.0
    # A new mask comes from the current magnitudes, not the old mask.
    grown = (~first["0.weight"]).nonzero()[0].tolist()
    with torch.no_grad():
        weights["0.weight"][tuple(grown)] = 100.0
    second = sparsifier.prune(0.8, scope="layerwise")
    assert second["0.weight"][tuple(grown)]
    for name, weight in weights.items():
        assert int((weight == 0).sum()) == pruned_per_layer[name]


def test_hooks_remove():
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sparsifier = pruning.Sparsifier(pruning.prunable_parameters(model, exclude=()))
    sparsifier.attach(optimizer).remove()
    sparsifier.prune(0.5)
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    assert pruning.sparsity_stats(sparsifier.weights)["overall"] < 0.5


def test_state_dict_round_trip_through_torch_save():
    model = make_model()
    sparsifier = pruning.Sparsifier(pruning.prunable_parameters(model, exclude=()))
    masks = sparsifier.prune(0.6)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "sparsifier": sparsifier.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer)

    fresh = make_model(seed=1)
    fresh.load_state_dict(checkpoint["model"])
    restored = pruning.Sparsifier(pruning.prunable_parameters(fresh, exclude=()))
    assert not restored.is_sparse
    restored.load_state_dict(checkpoint["sparsifier"])
    assert restored.masks.keys() == masks.keys()
    assert all(torch.equal(restored.masks[n], masks[n]) for n in masks)

    dense = pruning.Sparsifier(pruning.prunable_parameters(fresh, exclude=()))
    dense.load_state_dict(pruning.Sparsifier(pruning.prunable_parameters(model, exclude=())).state_dict())
    assert dense.masks == {}


def test_load_applies_masks_and_rejects_mismatches():
    model = make_model()
    sparsifier = pruning.Sparsifier(pruning.prunable_parameters(model, exclude=()))
    state = {"masks": {"0.weight": torch.zeros(32, 16, dtype=torch.bool)}}
    sparsifier.load_state_dict(state)
    assert (model[0].weight == 0).all() and (model[2].weight != 0).all()
    with pytest.raises(ValueError, match="unknown weight"):
        sparsifier.load_state_dict({"masks": {"9.weight": torch.ones(2, 2, dtype=torch.bool)}})
    with pytest.raises(ValueError, match="shape"):
        sparsifier.load_state_dict({"masks": {"0.weight": torch.ones(16, 32, dtype=torch.bool)}})
    with pytest.raises(ValueError, match="bool"):
        sparsifier.load_state_dict({"masks": {"0.weight": torch.ones(32, 16)}})
    with pytest.raises(ValueError, match="'masks'"):
        sparsifier.load_state_dict({})
    with pytest.raises(ValueError, match="empty"):
        pruning.Sparsifier({})
