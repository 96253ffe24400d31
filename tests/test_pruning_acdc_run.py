"""A short AC/DC run of a tiny timm ViT trained with HORST on synthetic data: exact
target sparsity in every compressed epoch, regrowth in decompressed ones, a sparse
final model."""

import math

import pytest
import torch
from torch import nn

import pruning

horst = pytest.importorskip("horst")
timm = pytest.importorskip("timm")

SPARSITY = 0.8


@pytest.fixture
def one_thread():
    # Tiny tensors: thread start-up costs more than it saves, badly so on shared cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_acdc_run_with_horst(one_thread):
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=16,
        patch_size=4,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=4,
    )
    images = torch.randn(64, 3, 16, 16)
    labels = torch.randint(0, 4, (64,))
    optimizer = horst.HORST(model.parameters(), lr=1e-3, weight_decay=0.05, alpha=10.0, beta=0.1, fused=False)
    weights = pruning.prunable_parameters(model, "vit")
    others = {n: p for n, p in model.named_parameters() if n not in weights}
    num_prunable = sum(w.numel() for w in weights.values())
    sparsifier = pruning.Sparsifier(weights)
    schedule = pruning.ACDCSchedule(
        12, dense_warmup=2, compressed=2, decompressed=2, final_decompressed=2, final_compressed=2
    )  # dense 0-1, C 2-3, D 4-5, C 6-7, D 8-9, C 10-11

    phases, masks, previous_masks = [], {}, {}
    for epoch in range(schedule.total_epochs):
        action = schedule.action(epoch)
        if action == "prune":
            previous_masks, masks = masks, sparsifier.prune(SPARSITY)
        elif action == "restore":
            sparsifier.restore()
            pruning.reset_optimizer_moments(optimizer, weights)
            assert all((optimizer.state[w]["exp_avg"] == 0).all() for w in weights.values())
        for batch in range(4):
            x, y = images[batch * 16 : (batch + 1) * 16], labels[batch * 16 : (batch + 1) * 16]
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            sparsifier.mask_grads_()
            optimizer.step()
            sparsifier.apply_masks_()

        phase = schedule.phase(epoch)
        phases.append(phase)
        stats = pruning.sparsity_stats(weights)
        if phase == "compressed":
            assert stats["zeros"] == math.floor(SPARSITY * num_prunable), epoch
            for name, weight in weights.items():
                assert (weight[~masks[name]] == 0).all() and (weight[masks[name]] != 0).all(), (epoch, name)
        elif phase == "decompressed":
            regrown = sum(int((weights[n][~masks[n]] != 0).sum()) for n in weights)
            assert regrown > 0.9 * stats["numel"] * SPARSITY, epoch
            assert stats["overall"] < 0.05, epoch
        else:
            assert stats["overall"] == 0.0
        assert all((p != 0).any() for p in others.values())
        assert all(torch.isfinite(p).all() for p in model.parameters())

    assert phases == ["dense"] * 2 + (["compressed"] * 2 + ["decompressed"] * 2) * 2 + ["compressed"] * 2
    # Masks are recomputed at every compression, from the regrown weights.
    assert any(not torch.equal(masks[n], previous_masks[n]) for n in weights)
    final = pruning.sparsity_stats(weights)
    assert final["overall"] == math.floor(SPARSITY * num_prunable) / num_prunable
    assert pruning.sparsity_stats(others)["overall"] < 0.05  # head, norms, embeddings stay dense
