"""Sparsity statistics and magnitude histograms."""

import pytest
import torch

import pruning


def test_sparsity_stats():
    weights = {"a": torch.tensor([[0.0, 1.0], [0.0, 0.0]]), "b": torch.ones(2, 3)}
    stats = pruning.sparsity_stats(weights)
    assert stats["per_layer"] == {"a": 0.75, "b": 0.0}
    assert stats["overall"] == pytest.approx(3 / 10) and stats["zeros"] == 3 and stats["numel"] == 10


def test_sparsity_stats_after_global_pruning():
    generator = torch.Generator().manual_seed(0)
    weights = {
        "a": torch.randn(30, 40, generator=generator),
        "b": 3 * torch.randn(50, 20, generator=generator),
    }
    pruning.prune_(weights, 0.9, scope="global")
    stats = pruning.sparsity_stats(weights)
    assert stats["zeros"] == int(0.9 * 2200)
    assert stats["per_layer"]["a"] > 0.9 > stats["per_layer"]["b"]


def test_linear_histogram_counts_everything():
    weights = {"a": torch.tensor([0.0, -0.5, 1.0, 0.25]), "b": torch.tensor([[2.0, -2.0]])}
    counts, edges = pruning.magnitude_histogram(weights, bins=4, log=False)
    assert counts.dtype == torch.int64 and edges.dtype == torch.float64
    assert edges.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert counts.tolist() == [2, 1, 1, 2]  # [0, .5): 0, .25; [.5, 1): .5; [1, 1.5): 1; [1.5, 2]: 2, 2


def test_log_histogram_skips_zeros_and_matches_numpy():
    generator = torch.Generator().manual_seed(1)
    weights = {"a": torch.randn(100, 100, generator=generator), "b": torch.randn(10, 10, generator=generator)}
    pruning.prune_(weights, 0.5)
    counts, edges = pruning.magnitude_histogram(weights, bins=30, log=True)
    assert counts.sum() == pruning.sparsity_stats(weights)["numel"] - pruning.sparsity_stats(weights)["zeros"]
    values = torch.cat([w[w != 0].abs().log10() for w in weights.values()]).double()
    expected, expected_edges = torch.histogram(values, bins=30)
    assert torch.allclose(edges, expected_edges.double(), atol=1e-6)
    assert (counts - expected.long()).abs().max() <= 1  # float rounding at a bin edge


def test_histogram_fixed_range_and_errors():
    weights = {"a": torch.tensor([0.001, 0.01, 0.1, 10.0])}
    counts, edges = pruning.magnitude_histogram(weights, bins=2, value_range=(-3.5, -0.5))
    assert counts.tolist() == [1, 2] and edges.tolist() == [-3.5, -2.0, -0.5]
    with pytest.raises(ValueError, match="all weights are zero"):
        pruning.magnitude_histogram({"a": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="value_range"):
        pruning.magnitude_histogram(weights, value_range=(1.0, 1.0))
    with pytest.raises(ValueError, match="bins"):
        pruning.magnitude_histogram(weights, bins=0)


@pytest.fixture
def deterministic():
    """torch.use_deterministic_algorithms(True) for the test, as `deterministic=true` runs set it."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


def test_histogram_counts_what_histc_counts_of_each_weight_in_float64(deterministic):
    """The counts are unchanged on the CPU, deterministic or not: torch.histc's over each
    weight's log-magnitudes in float64, summed."""
    generator = torch.Generator().manual_seed(2)
    weights = {"a": torch.randn(64, 32, generator=generator), "b": 1e-3 * torch.randn(7, generator=generator)}
    counts, _ = pruning.magnitude_histogram(weights, bins=17, log=True)
    values = {name: w.abs().reshape(-1).log10() for name, w in weights.items()}
    low = min(float(v.min()) for v in values.values())
    high = max(float(v.max()) for v in values.values())
    expected = sum(torch.histc(v.double(), bins=17, min=low, max=high) for v in values.values())
    assert torch.equal(counts, expected.long())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check on a GPU machine)")
def test_histogram_of_cuda_weights_under_deterministic_algorithms(deterministic):
    """torch.histc has no deterministic CUDA kernel: `deterministic=true` runs stopped at their
    first weight histogram. CUDA weights are counted as their CPU copies are (CPU stand-in:
    the test above)."""
    generator = torch.Generator().manual_seed(3)
    weights = {"a": torch.randn(100, 50, generator=generator), "b": torch.randn(30, generator=generator)}
    pruning.prune_(weights, 0.5)
    on_gpu = {name: w.cuda() for name, w in weights.items()}
    counts, _ = pruning.magnitude_histogram(on_gpu, bins=30, log=True)  # as the pipelines call it
    assert counts.sum() == pruning.sparsity_stats(weights)["numel"] - pruning.sparsity_stats(weights)["zeros"]
    # |w| is exact on either device (log10 may round differently at a bin edge)
    for actual, expected in zip(
        pruning.magnitude_histogram(on_gpu, bins=30, log=False),
        pruning.magnitude_histogram(weights, bins=30, log=False),
    ):
        assert torch.equal(actual, expected)
