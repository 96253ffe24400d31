"""Prunable-weight selection on tiny timm ViT and HF GPT-2 models."""

import pytest
import torch
from torch import nn

import pruning

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

VIT_MATRICES = ["attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"]
GPT2_MATRICES = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]


@pytest.fixture(scope="module")
def vit():
    return timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=10,
    )


@pytest.fixture(scope="module")
def gpt2():
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)


def test_vit_preset(vit):
    weights = pruning.prunable_parameters(vit, "vit")
    assert list(weights) == [f"blocks.{b}.{m}.weight" for b in range(2) for m in VIT_MATRICES]
    params = dict(vit.named_parameters())
    assert all(weights[name] is params[name] for name in weights)
    assert pruning.prunable_parameters(vit, "deit").keys() == weights.keys()


def test_gpt2_preset_finds_conv1d(gpt2):
    weights = pruning.prunable_parameters(gpt2, "gpt2")
    assert list(weights) == [f"transformer.h.{b}.{m}.weight" for b in range(2) for m in GPT2_MATRICES]
    assert weights["transformer.h.0.attn.c_attn.weight"].shape == (32, 96)  # Conv1D: [in, out]
    # The bare GPT2Model has no "transformer." prefix; the preset still applies.
    assert len(pruning.prunable_parameters(gpt2.transformer, "gpt2")) == 8


@pytest.mark.parametrize("model_name,preset", [("vit", "vit"), ("gpt2", "gpt2")])
def test_default_selection_equals_preset(request, model_name, preset):
    model = request.getfixturevalue(model_name)
    selected = pruning.prunable_parameters(model)
    assert selected.keys() == pruning.prunable_parameters(model, preset).keys()
    excluded = ("embed", "wte", "wpe", "head", "norm", "ln_", "bias", "pos_embed", "cls_token")
    assert not any(word in name for name in selected for word in excluded)


def test_exclude_and_module_types(vit):
    everything = pruning.prunable_parameters(vit, exclude=())
    assert "head.weight" in everything and "patch_embed.proj.weight" in everything
    linear_only = pruning.prunable_parameters(vit, exclude=(), module_types=[nn.Linear])
    assert "patch_embed.proj.weight" not in linear_only and "head.weight" in linear_only
    by_name = pruning.prunable_parameters(vit, module_types=["Linear"])
    assert by_name.keys() == pruning.prunable_parameters(vit, "vit").keys()


def test_patterns(vit, gpt2):
    mlp = pruning.prunable_parameters(vit, patterns=[r"mlp\.fc\d$"])
    assert list(mlp) == [f"blocks.{b}.mlp.fc{i}.weight" for b in range(2) for i in (1, 2)]
    first_block = pruning.prunable_parameters(gpt2, patterns=[r"h\.0\."])
    assert len(first_block) == 4 and all(".h.0." in n for n in first_block)


def test_wrapped_model_names():
    wrapped = nn.Sequential()
    wrapped.add_module(
        "module",
        nn.ModuleDict({"blocks": nn.ModuleList([nn.ModuleDict({"mlp": nn.ModuleDict({"fc1": nn.Linear(4, 4)})})])}),
    )
    assert list(pruning.prunable_parameters(wrapped, "vit")) == ["module.blocks.0.mlp.fc1.weight"]


def test_tied_weight_appears_once_under_its_first_name(gpt2):
    weights = pruning.prunable_parameters(gpt2, exclude=(), module_types=[nn.Linear])
    assert list(weights) == ["transformer.wte.weight"]  # lm_head.weight is tied to it


def test_nothing_matches_lists_patterns_and_names(vit):
    with pytest.raises(ValueError) as error:
        pruning.prunable_parameters(vit, "gpt2")
    message = str(error.value)
    assert r"c_attn" in message and "blocks.0.attn.qkv.weight" in message
    with pytest.raises(ValueError, match="selected nothing"):
        pruning.prunable_parameters(vit, patterns=["no_such_module"])


def test_invalid_selection_arguments(vit):
    with pytest.raises(ValueError, match="preset"):
        pruning.prunable_parameters(vit, "resnet")
    with pytest.raises(ValueError, match="regex"):
        pruning.prunable_parameters(vit, patterns=["(unclosed"])
    with pytest.raises(ValueError, match="module_types"):
        pruning.prunable_parameters(vit, module_types=[])


def test_input_dims(vit, gpt2):
    assert set(pruning.input_dims(gpt2, pruning.prunable_parameters(gpt2, "gpt2")).values()) == {0}
    assert set(pruning.input_dims(vit, pruning.prunable_parameters(vit, "vit")).values()) == {1}
    with pytest.raises(ValueError, match="not the .weight"):
        pruning.input_dims(vit, {"x": torch.zeros(2, 2)})
