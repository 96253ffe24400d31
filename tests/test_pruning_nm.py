"""N:M masks against a per-group reference, both weight layouts, validation."""

import pytest
import torch

import pruning


def reference_nm_rows(weight_out_in, n, m):
    """Loop reference for [out, in] weights: in each row, keep the n largest |w| of every
    m consecutive entries, pruning the earlier of equal magnitudes first."""
    mask = torch.zeros_like(weight_out_in, dtype=torch.bool)
    for row in range(weight_out_in.shape[0]):
        for start in range(0, weight_out_in.shape[1], m):
            group = weight_out_in[row, start : start + m].abs().tolist()
            # Sort by (magnitude, -index): among ties the later entry ranks higher.
            ranked = sorted(range(m), key=lambda i: (group[i], i))
            for i in ranked[m - n :]:
                mask[row, start + i] = True
    return mask


@pytest.mark.parametrize("n,m", [(2, 4), (1, 4), (4, 8), (3, 3)])
def test_linear_layout_matches_reference(n, m):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(6, 24, generator=generator)
    mask = pruning.nm_masks({"w": weight}, n=n, m=m)["w"]
    assert mask.dtype == torch.bool and torch.equal(mask, reference_nm_rows(weight, n, m))
    assert (mask.view(6, -1, m).sum(-1) == n).all()


def test_ties_prune_earlier_first():
    weight = torch.tensor([[1.0, -1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    mask = pruning.nm_masks({"w": weight}, n=2, m=4)["w"]
    assert mask.tolist() == [[False, False, True, True, False, False, True, True]]
    assert torch.equal(mask, reference_nm_rows(weight, 2, 4))


def test_conv1d_layout_groups_along_dim0():
    generator = torch.Generator().manual_seed(1)
    linear_weight = torch.randn(5, 16, generator=generator)  # [out, in]
    conv1d_weight = linear_weight.t().contiguous()  # HF Conv1D stores [in, out]
    linear_mask = pruning.nm_masks({"w": linear_weight})["w"]
    conv1d_mask = pruning.nm_masks({"w": conv1d_weight}, dim=0)["w"]
    assert torch.equal(conv1d_mask, linear_mask.t())
    per_name = pruning.nm_masks({"a": linear_weight, "b": conv1d_weight}, dim={"a": 1, "b": 0})
    assert torch.equal(per_name["a"], linear_mask) and torch.equal(per_name["b"], conv1d_mask)


def test_conv2d_groups_along_input_channels():
    weight = torch.randn(3, 8, 2, 2, generator=torch.Generator().manual_seed(2))
    mask = pruning.nm_masks({"w": weight})["w"]
    assert (mask.view(3, 2, 4, 2, 2).sum(2) == 2).all()


def test_sparsifier_takes_nm_masks():
    weight = torch.nn.Parameter(torch.randn(4, 8))
    sparsifier = pruning.Sparsifier({"w": weight})
    sparsifier.set_masks(pruning.nm_masks({"w": weight}))
    assert int((weight == 0).sum()) == 16


def test_invalid_nm_arguments():
    weight = {"w": torch.randn(4, 6)}
    with pytest.raises(ValueError, match="multiple of m=4"):
        pruning.nm_masks(weight)
    with pytest.raises(ValueError, match="0 < n <= m"):
        pruning.nm_masks(weight, n=3, m=2)
    with pytest.raises(ValueError, match="0 < n <= m"):
        pruning.nm_masks(weight, n=0, m=2)
    with pytest.raises(ValueError, match="must be an int"):
        pruning.nm_masks(weight, n=1.0, m=2)
    with pytest.raises(ValueError, match="out of range"):
        pruning.nm_masks(weight, m=2, dim=2)
    with pytest.raises(ValueError, match="no entry"):
        pruning.nm_masks(weight, m=2, dim={"other": 0})


# ---- 2:4 in the one-shot dispatcher, the Sparsifier, and the sparse-kernel conversion ------------


def _exactly_n_of_m_along(weight, dim, n=2, m=4):
    groups = weight.movedim(dim, -1).reshape(*weight.movedim(dim, -1).shape[:-1], -1, m)
    return bool(((groups != 0).sum(-1) == n).all())


@pytest.mark.parametrize("method", ["magnitude", "wanda"])
def test_two_of_four_along_inputs_for_conv1d_and_linear(method):
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(3)
    model = torch.nn.Sequential(Conv1D(12, 16), torch.nn.Linear(12, 8))  # Conv1D [in=16, out=12]; Linear [8, 12]
    weights = pruning.prunable_parameters(model)
    dims = pruning.input_dims(model, weights)
    assert dims == {"0.weight": 0, "1.weight": 1}
    with pruning.InputNorms(model, weights) as collector:
        model(torch.randn(2, 5, 16))
    pruning.one_shot_prune_(weights, method=method, pattern="2:4", dim=dims, input_norms=collector.norms())
    assert _exactly_n_of_m_along(weights["0.weight"], 0) and _exactly_n_of_m_along(weights["1.weight"], 1)
    assert pruning.is_nm_sparse(weights["0.weight"], dim=0) and not pruning.is_nm_sparse(weights["0.weight"], dim=1)
    assert pruning.sparsity_stats(weights)["overall"] == 0.5


def test_sparsifier_prunes_nm_along_its_input_dims_and_keeps_zeros():
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(4)
    model = torch.nn.Sequential(Conv1D(8, 16), torch.nn.Linear(8, 8))
    weights = pruning.prunable_parameters(model)
    sparsifier = pruning.Sparsifier(weights, input_dims=pruning.input_dims(model, weights))
    masks = sparsifier.prune(0.5, pattern="2:4")
    assert _exactly_n_of_m_along(weights["0.weight"], 0) and _exactly_n_of_m_along(weights["1.weight"], 1)
    assert torch.equal(masks["1.weight"], weights["1.weight"] != 0)
    with torch.no_grad():
        for w in weights.values():
            w.add_(1.0)
    sparsifier.apply_masks_()
    assert _exactly_n_of_m_along(weights["0.weight"], 0)
    with pytest.raises(ValueError, match="its sparsity is 0.5"):
        sparsifier.prune(0.9, pattern="2:4")
    # Without input_dims every weight is taken as nn.Linear [out, in] (timm's ViT).
    linear = torch.nn.Parameter(torch.randn(4, 8))
    pruning.Sparsifier({"w": linear}).prune(0.75, pattern="1:4")
    assert _exactly_n_of_m_along(linear, 1, n=1)


def test_conv1d_to_linear_gives_the_same_outputs():
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(5)
    model = torch.nn.Sequential(Conv1D(6, 8), torch.nn.ReLU(), Conv1D(4, 6))
    x = torch.randn(3, 8)
    expected = model(x)
    assert pruning.conv1d_to_linear_(model) == ["0", "2"]
    assert isinstance(model[0], torch.nn.Linear) and model[0].weight.shape == (6, 8)
    assert torch.allclose(model(x), expected, atol=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU message")
def test_semi_structured_conversion_on_cpu_says_it_needs_a_gpu():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64))
    pruning.Sparsifier(pruning.prunable_parameters(model)).prune(0.5, pattern="2:4")
    with pytest.raises(RuntimeError, match="need a CUDA GPU.*no speed-up"):
        pruning.to_semi_structured_(model)
    assert isinstance(model[0].weight, torch.nn.Parameter) and model[0].weight.layout == torch.strided  # untouched
