"""timm's optimizer tests (``tests/test_optim.py`` of huggingface/pytorch-image-models, itself
adapted from PyTorch's older optimizer tests), ported to pytest and run over the four
optimizers of ``horst`` on the plain and the fast path.

The helpers keep timm's names, problems and assertions: ``_test_basic_cases`` (state-dict
round trip in lockstep, then 200 steps that must lower the loss, on contiguous and
non-contiguous tensors, with plain lists and param-group dicts), ``_test_rosenbrock`` (cyclic
coordinate descent on Rosenbrock's function from (1.5, 1.5): the distance to the minimum must
not grow) and ``_test_model`` (a small sigmoid MLP whose loss must fall at every one of 20
steps). The constructors are called directly there; the tests at the end build horst's
optimizers the way timm builds its own, through ``create_optimizer_v2`` (``horst.timm``). Not ported: the CUDA variants of ``_test_basic_cases``
and ``_test_state_dict`` (no GPU here), and timm's uncoalesced sparse gradients in the
Rosenbrock test, which timm turns dense before the step anyway (``to_dense()``): the same
dense gradient is given here.
"""

from __future__ import annotations

import copy
import functools
import subprocess
import sys

import pytest
import torch
from timm.models import VisionTransformer
from timm.optim import create_optimizer_v2, list_optimizers
from timm.scheduler import CosineLRScheduler
from torch.nn import Parameter

import horst

PATHS = [pytest.param(False, id="plain"), pytest.param(True, id="fused")]


def _build_params_dict(weight, bias, **kwargs):
    return [{"params": [weight]}, dict(params=[bias], **kwargs)]


def _build_params_dict_single(weight, bias, **kwargs):
    return [dict(params=bias, **kwargs)]


def _test_basic_cases_template(weight, bias, input_, constructor, scheduler_constructors):
    weight, bias, input_ = Parameter(weight), Parameter(bias), Parameter(input_)
    optimizer = constructor(weight, bias)
    schedulers = [make(optimizer) for make in scheduler_constructors]
    repr(optimizer)  # it can be printed

    def fn():
        optimizer.zero_grad()
        loss = (weight.mv(input_) + bias).pow(2).sum()
        loss.backward()
        return loss

    initial_value = fn().item()
    for _ in range(200):
        for scheduler in schedulers:
            scheduler.step()
        optimizer.step(fn)
    assert fn().item() < initial_value


def _test_state_dict(weight, bias, input_, constructor):
    weight, bias, input_ = Parameter(weight), Parameter(bias), Parameter(input_)

    def fn_base(optimizer, weight, bias):
        optimizer.zero_grad()
        loss = (weight.mv(input_) + bias).pow(2).sum()
        loss.backward()
        return loss

    optimizer = constructor(weight, bias)
    fn = functools.partial(fn_base, optimizer, weight, bias)
    for _ in range(20):  # prime the optimizer
        optimizer.step(fn)
    with torch.no_grad():
        weight_c = Parameter(weight.clone().detach())
        bias_c = Parameter(bias.clone().detach())
    optimizer_c = constructor(weight_c, bias_c)
    fn_c = functools.partial(fn_base, optimizer_c, weight_c, bias_c)
    state_dict = copy.deepcopy(optimizer.state_dict())
    optimizer_c.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    for _ in range(20):  # both in lockstep
        optimizer.step(fn)
        optimizer_c.step(fn_c)
        torch.testing.assert_close(weight, weight_c, rtol=0, atol=0)
        torch.testing.assert_close(bias, bias_c, rtol=0, atol=0)
    # deterministic with equal but not identical parameters
    torch.testing.assert_close(optimizer.state_dict()["state"], optimizer_c.state_dict()["state"], rtol=0, atol=0)
    assert repr(optimizer.state_dict()["param_groups"]) == repr(optimizer_c.state_dict()["param_groups"])
    # repeated parameters have identical representations in the state dict
    optimizer_c.param_groups.extend(optimizer_c.param_groups)
    assert repr(optimizer.state_dict()["param_groups"][-1]) == repr(optimizer_c.state_dict()["param_groups"][-1])
    assert state_dict.keys() == optimizer.state_dict().keys()

    def public(obj):
        return {k for k in obj.__dict__ if not k.startswith("_")}

    assert public(optimizer) == public(copy.deepcopy(optimizer))


def _test_basic_cases(constructor, scheduler_constructors=()):
    generator = torch.Generator().manual_seed(0)
    randn = functools.partial(torch.randn, generator=generator)
    _test_state_dict(randn(10, 5), randn(10), randn(5), constructor)
    _test_basic_cases_template(randn(10, 5), randn(10), randn(5), constructor, scheduler_constructors)
    # non-contiguous parameters
    _test_basic_cases_template(
        randn(10, 5, 2)[..., 0], randn(10, 2)[..., 0], randn(5), constructor, scheduler_constructors
    )


def rosenbrock(tensor):
    x, y = tensor
    return (1 - x) ** 2 + 100 * (y - x**2) ** 2


def drosenbrock(tensor):
    x, y = tensor
    return torch.tensor((-400 * x * (y - x**2) - 2 * (1 - x), 200 * (y - x**2)))


def _test_rosenbrock(constructor, scheduler_constructors=()):
    params = Parameter(torch.tensor([1.5, 1.5]))
    optimizer = constructor([params])
    schedulers = [make(optimizer) for make in scheduler_constructors]
    solution = torch.tensor([1.0, 1.0])
    initial_dist = params.clone().detach().dist(solution)

    def eval_(params, w):
        # depending on w, only the x or the y gradient (timm: as an uncoalesced sparse tensor, made dense)
        optimizer.zero_grad()
        loss = rosenbrock(params)
        loss.backward()
        grad = drosenbrock(params.clone().detach())
        with torch.no_grad():
            params.grad = torch.stack([grad[0], torch.zeros(())]) if w else torch.stack([torch.zeros(()), grad[1]])
        return loss

    for i in range(2000):  # cyclic coordinate descent
        optimizer.step(functools.partial(eval_, params, i % 2))
        for scheduler in schedulers:
            scheduler.step()
    assert params.clone().detach().dist(solution) <= initial_dist


def _test_model(constructor):
    weight = torch.tensor([[-0.2109, -0.4976], [-0.1413, -0.3420], [-0.2524, 0.6976]], requires_grad=True)
    bias = torch.tensor([-0.1085, -0.2979, 0.6892], requires_grad=True)
    weight2 = torch.tensor([[-0.0508, -0.3941, -0.2843]], requires_grad=True)
    bias2 = torch.tensor([-0.0711], requires_grad=True)
    input_ = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]).reshape(3, 2)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Sigmoid(), torch.nn.Linear(3, 1), torch.nn.Sigmoid())
    model.load_state_dict({"0.weight": weight, "0.bias": bias, "2.weight": weight2, "2.bias": bias2})
    optimizer = constructor(model.parameters())
    prev_loss = float("inf")
    for _ in range(20):
        optimizer.zero_grad()
        loss = model(input_).sum()
        loss.backward()
        assert loss.item() < prev_loss
        prev_loss = loss.item()
        optimizer.step()


# ------------------------------------------------------------------------------ the tests, as timm's


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("order", ["ms", "sm"])
def test_horst(order, fused):
    """As timm's ``test_adam`` (AdamW family): same lrs."""
    make = functools.partial(horst.HORST, order=order, fused=fused)
    _test_basic_cases(lambda weight, bias: make([weight, bias], lr=1e-3))
    _test_basic_cases(lambda weight, bias: make(_build_params_dict(weight, bias, lr=3e-3), lr=1e-3))
    _test_basic_cases(lambda weight, bias: make(_build_params_dict_single(weight, bias, lr=3e-3), lr=1e-3))
    _test_rosenbrock(lambda params: make(params, lr=5e-2))
    _test_model(lambda params: make(params, lr=5e-2))


@pytest.mark.parametrize("fused", PATHS)
def test_ham(fused):
    """As timm's ``test_adam``. In ``_test_basic_cases`` (gradients ~10-100) HAM's exponent
    lr * alpha * |g| at the authors' alpha = 200 reaches its clamp of 5 and the loss explodes
    (``test_ham_basic_cases_diverge_at_alpha_200``): those run at alpha 20, where they must pass."""
    make = functools.partial(horst.HAM, fused=fused)
    _test_basic_cases(lambda weight, bias: make([weight, bias], lr=1e-3, alpha=20.0))
    _test_basic_cases(lambda weight, bias: make(_build_params_dict(weight, bias, lr=3e-3), lr=1e-3, alpha=20.0))
    _test_basic_cases(lambda weight, bias: make(_build_params_dict_single(weight, bias, lr=3e-3), lr=1e-3, alpha=20.0))
    _test_rosenbrock(lambda params: make(params, lr=5e-2))
    _test_model(lambda params: make(params, lr=5e-2))


def test_ham_basic_cases_diverge_at_alpha_200():
    with pytest.raises(AssertionError):
        _test_basic_cases(lambda weight, bias: horst.HAM([weight, bias], lr=1e-3, fused=False))


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("order", ["ms", "sm"])
def test_horst_lion(order, fused):
    """timm's file has no Lion test: the pattern of its ``test_lamb``/``test_lars`` (lr 1e-3
    everywhere). Rosenbrock's parameter is 1-D, so it is plain Lion there unless the group says
    ``hyperbolic``: both are run, the hyperbolic one at alpha 3 (at the default 10 its mirror
    step, a factor up to exp(alpha * lr) per step towards or away from zero, ends the 2000
    coordinate steps farther from (1, 1) than it started in order "ms")."""
    make = functools.partial(horst.HORSTLion, order=order, fused=fused)
    _test_basic_cases(lambda weight, bias: make([weight, bias], lr=1e-3))
    _test_basic_cases(lambda weight, bias: make(_build_params_dict(weight, bias, lr=1e-3), lr=1e-3))
    _test_basic_cases(lambda weight, bias: make(_build_params_dict_single(weight, bias, lr=1e-3), lr=1e-3))
    _test_basic_cases(lambda weight, bias: make(_build_params_dict_single(weight, bias, lr=1e-3)))
    _test_rosenbrock(lambda params: make(params, lr=1e-3))
    _test_rosenbrock(lambda params: make([{"params": params, "hyperbolic": True}], lr=1e-3, alpha=3.0))
    _test_model(lambda params: make(params, lr=1e-3))


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("order", ["ms", "sm"])
def test_horst_sgd(order, fused):
    """As timm's ``test_sgd`` (its momentum variants included): same lrs. timm's momentum=1 cases
    (lr 3e-3) grow the gradients to ~1e2, where SGD's unbounded pull exp(alpha * lr * |g|) at
    the default alpha 10 overshoots; they run at alpha 1."""
    make = functools.partial(horst.HORSTSGD, order=order, fused=fused)
    _test_basic_cases(lambda weight, bias: make([weight, bias], lr=1e-3))
    _test_basic_cases(lambda weight, bias: make(_build_params_dict(weight, bias, lr=1e-2), lr=1e-3))
    _test_basic_cases(lambda weight, bias: make(_build_params_dict_single(weight, bias, lr=1e-2), lr=1e-3))
    _test_basic_cases(lambda weight, bias: make(_build_params_dict_single(weight, bias, lr=1e-2)))
    _test_basic_cases(lambda weight, bias: make([weight, bias], lr=3e-3, momentum=1, alpha=1.0))
    _test_basic_cases(lambda weight, bias: make([weight, bias], lr=3e-3, momentum=1, weight_decay=0.1, alpha=1.0))
    _test_rosenbrock(lambda params: make(params, lr=1e-3))
    _test_model(lambda params: make(params, lr=1e-3))


# ------------------------------------------------------------------------------ timm's registry


TIMM_NAMES = {"horst": horst.HORST, "ham": horst.HAM, "horstlion": horst.HORSTLion, "horstsgd": horst.HORSTSGD}


def tiny_vit() -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=3, num_heads=2, num_classes=3)


@pytest.mark.parametrize("name", TIMM_NAMES)
def test_create_optimizer_v2_builds_horst_optimizers(name):
    assert name in list_optimizers()
    model = tiny_vit()
    optimizer = create_optimizer_v2(model, opt=name, lr=1e-3, weight_decay=0.05)
    assert type(optimizer) is TIMM_NAMES[name]
    # timm's groups: weight decay on matrices, none on 1-D tensors (nor on its no_weight_decay list)
    by_decay = {g["weight_decay"]: g for g in optimizer.param_groups}
    assert set(by_decay) == {0.0, 0.05} and all(p.ndim >= 2 for p in by_decay[0.05]["params"])
    assert all(g["lr"] == 1e-3 for g in optimizer.param_groups)
    if name == "horstsgd":
        assert optimizer.param_groups[0]["momentum"] == 0.9  # timm's default for optimizers with momentum
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(4, 3, 16, 16)).sum().backward()
    optimizer.step()
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_create_optimizer_v2_layer_decay_and_lookahead():
    model = tiny_vit()
    optimizer = create_optimizer_v2(model, opt="horst", lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    scales = sorted({g["lr_scale"] for g in optimizer.param_groups})
    assert len(scales) == 5 and scales[-1] == 1.0  # embeddings, 3 blocks, head: each layer down by 0.5
    scheduler = CosineLRScheduler(optimizer, t_initial=10)
    scheduler.step(3)
    for group in optimizer.param_groups:
        assert group["lr"] == pytest.approx(scheduler._get_lr(3)[0] * group["lr_scale"])
    model(torch.randn(4, 3, 16, 16)).sum().backward()
    optimizer.step()
    lookahead = create_optimizer_v2(tiny_vit(), opt="lookahead_ham", lr=1e-3)
    assert type(lookahead._base_optimizer) is horst.HAM


IMPORT_ORDERS = {
    "horst first": "import sys, horst; assert 'timm' not in sys.modules, 'import horst imported timm'; import timm.optim",
    "timm first": "import timm.optim, horst",
}


def test_import_horst_registers_with_timm_in_either_order_and_imports_no_timm():
    check = f"; print(sorted(n for n in timm.optim.list_optimizers() if n in {sorted(TIMM_NAMES)}))"
    processes = {
        order: subprocess.Popen(
            [sys.executable, "-c", code + check], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for order, code in IMPORT_ORDERS.items()
    }
    for order, process in processes.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, (order, err)
        assert out.strip() == str(sorted(TIMM_NAMES)), (order, out, err)
