"""The fast paths against the plain path and the float32 reference: the C kernel (dense
float32 on CPU) and the torch.compile kernel (everything else; CUDA's path, checked here on
CPU, since no GPU is available), for every base (AdamW, Lion, SGD); the scalar ordering the
two share; the trust rules of the kernel's build cache, on real files and permissions.

Compiling costs seconds per graph (one per base, order, guard and dtype), so everything that
needs the compiled path is checked in this one module (the ported generic suites run the fast
path on float32 CPU tensors: the C kernel).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import stat
from pathlib import Path

import pytest
import torch
from horst_reference import HYPER, LRS, assert_close, reference_ham_step, reference_horst_step, run, run_reference

import horst
from horst import _cpu_kernel, _fast_path
from horst.functional import SCALARS, scalars
from horst.mirror import EXP_ARG_MAX, EXP_ARG_MIN, EXP_POLY

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # a silent fallback would pass


def horst_factory(order, fused, alpha=20.0, beta=0.5):
    return lambda ps: horst.HORST(
        ps,
        lr=LRS[0],
        betas=HYPER["betas"],
        eps=HYPER["eps"],
        weight_decay=HYPER["wd"],
        alpha=alpha,
        beta=beta,
        order=order,
        fused=fused,
    )


@pytest.fixture(params=["C kernel", "compiled"])
def fast_path(request, monkeypatch):
    """Runs the test on one fast path and checks that it, and only it, did the work."""
    calls = {"C kernel": 0, "compiled": 0}
    kernel, compiled = _cpu_kernel.mirror_step_f32_, _fast_path._compiled_kernel()

    def count(name, function):
        def counted(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        return counted

    monkeypatch.setattr(_cpu_kernel, "mirror_step_f32_", count("C kernel", kernel))
    monkeypatch.setattr(_fast_path, "_compiled_kernel", lambda: count("compiled", compiled))
    if request.param == "compiled":  # as on CUDA
        monkeypatch.setattr(_cpu_kernel, "supports", lambda tensors: False)
    yield request.param
    assert calls[request.param] > 0
    assert sum(calls.values()) == calls[request.param]


@pytest.mark.parametrize("order", ["ms", "sm"])
def test_fast_path_matches_reference_and_plain_path(order, fast_path):
    fast, _ = run(horst_factory(order, fused=True), steps=20, lrs=LRS)
    plain, _ = run(horst_factory(order, fused=False), steps=20, lrs=LRS)
    reference = run_reference(reference_horst_step, 20, lrs=LRS, **HYPER, alpha=20.0, beta=0.5, order=order)
    assert_close(fast, reference)
    assert_close(fast, plain)


def test_ham_fast_path_matches_reference(fast_path):
    lrs = [lr / 5 for lr in LRS]
    make = lambda ps: horst.HAM(
        ps,
        lr=lrs[0],
        betas=HYPER["betas"],
        eps=HYPER["eps"],  # noqa: E731
        weight_decay=HYPER["wd"],
        fused=True,
    )
    fast, _ = run(make, steps=20, lrs=lrs)
    reference = run_reference(reference_ham_step, 20, lrs=lrs, **HYPER, alpha=200.0, beta=1e-3)
    assert_close(fast, reference)


def test_fast_path_without_mirror_is_adamw(fast_path):
    adamw, _ = run(
        lambda ps: torch.optim.AdamW(ps, lr=LRS[0], betas=HYPER["betas"], weight_decay=HYPER["wd"]),
        steps=50,
        lrs=LRS * 3,
    )
    fast, _ = run(horst_factory("ms", fused=True, alpha=0.0, beta=0.0), steps=50, lrs=LRS * 3)
    # not bit for bit: the fused kernels round the division and lerp differently from ATen's
    assert_close(fast, adamw)


def test_fast_path_bf16():
    fp32, _ = run(horst_factory("ms", fused=True), steps=10, lrs=LRS)
    bf16, optimizer = run(horst_factory("ms", fused=True), steps=10, lrs=LRS, dtype=torch.bfloat16)
    assert all(s["exp_avg_sq"].dtype == torch.bfloat16 for s in optimizer.state.values())
    for a, b in zip(bf16, fp32):
        torch.testing.assert_close(a.float(), b, atol=3e-2, rtol=3e-2)


def _layouts(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The same values as a contiguous tensor, a transposed (dense, permuted) one, and a
    strided slice of a larger tensor (not dense)."""
    transposed = tensor.t().contiguous().t()
    sliced = torch.zeros(tensor.shape[0], 2 * tensor.shape[1])[:, ::2]
    sliced.copy_(tensor)
    return [tensor.clone(), transposed, sliced]


@pytest.mark.parametrize("optimizer", ["horst_ms", "horst_sm", "ham"])
def test_cpu_kernel_on_large_tensors_over_threads(optimizer):
    """Tensors of many blocks (split over OpenMP threads), sizes that leave vector tails, a
    1-D one (no mirror step), and the same matrix in three memory layouts (contiguous and
    transposed: the C kernel; a strided slice: the plain path) in one param group."""
    generator = torch.Generator().manual_seed(0)
    make = {
        "horst_ms": lambda ps, fused: horst.HORST(ps, lr=1e-2, alpha=20.0, beta=0.5, fused=fused),
        "horst_sm": lambda ps, fused: horst.HORST(ps, lr=1e-2, alpha=20.0, beta=0.5, order="sm", fused=fused),
        # lr * alpha = 0.4, not 2: an exponent of 2 g with g ~ N(0, 1) sends weights through zero,
        # where the sign of a rounding difference decides the factor (e^x or e^-x), on any path
        "ham": lambda ps, fused: horst.HAM(ps, lr=2e-3, alpha=200.0, beta=1e-3, fused=fused),
    }[optimizer]
    initial = [torch.randn(100_003, generator=generator), torch.randn(257, 389, generator=generator)]
    grads = [[torch.randn(t.shape, generator=generator) for t in initial] for _ in range(5)]
    results = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for fused in (True, False):
            params = [torch.nn.Parameter(initial[0].clone())]
            params += [torch.nn.Parameter(t) for t in _layouts(initial[1])]
            assert [p.is_contiguous() for p in params] == [True, True, False, False]
            opt = make(params, fused)
            for vector_grad, matrix_grad in grads:
                params[0].grad = vector_grad.clone()
                for p, g in zip(params[1:], _layouts(matrix_grad)):
                    p.grad = g
                opt.step()
            results[fused] = [p.detach().clone() for p in params]
    finally:
        torch.set_num_threads(threads)
    assert_close(results[True], results[False])
    fast = results[True]
    assert not torch.equal(fast[1], initial[1])
    assert torch.equal(fast[1], fast[2])  # the C kernel, whatever the memory order


def test_cpu_kernel_polynomial_and_range_are_mirrors():
    source = _cpu_kernel.SOURCE.read_text()
    defined = [float(value) for value in re.findall(r"#define EXP_C[2-5] ([0-9.e-]+)f", source)]
    assert defined == list(EXP_POLY)
    assert float(re.search(r"#define EXP_ARG_MIN (\S+)f", source).group(1)) == EXP_ARG_MIN
    assert float(re.search(r"#define EXP_ARG_MAX (\S+)f", source).group(1)) == EXP_ARG_MAX


def _c_enum(source: str, first: str) -> list[str]:
    body = re.search(r"enum \{\s*(" + first + r"\b[^}]*)\}", source).group(1)
    return [name.strip() for name in body.split(",") if name.strip()]


def test_scalar_ordering_is_defined_once():
    """The compiled path unpacks ``SCALARS`` by position and the C kernel indexes the same
    array by its enum: the two orderings must be the same list of names."""
    source = _cpu_kernel.SOURCE.read_text()
    assert _c_enum(source, "GRAD_SCALE") == [name.upper() for name in SCALARS] + ["N_SCALARS"]
    bases = ["ADAMW", "LION", "SGD", "SGD_MOMENTUM", "SGD_NESTEROV"]
    assert _c_enum(source, "ADAMW") == bases + ["N_BASES"]
    assert [getattr(_cpu_kernel, f"BASE_{name}") for name in bases] == list(range(len(bases)))
    modes = ["NO_MIRROR", "MS_UPDATE", "SM", "MS_GRADIENT", "MS_GRADIENT_GUARDED"]
    assert _c_enum(source, "NO_MIRROR") == modes + ["N_MODES"]
    assert [getattr(_cpu_kernel, f"MODE_{name}") for name in modes] == list(range(len(modes)))


def test_cpu_kernel_refuses_an_unknown_base():
    t = torch.zeros(4)
    with pytest.raises(ValueError, match="unknown base"):
        _cpu_kernel.mirror_step_f32_([(t, t, t, t)], tuple(scalars()), base=99, mode=0)


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        (horst.HORSTLion, dict(lr=1e-3, weight_decay=0.1, alpha=20.0, beta=0.5)),
        (horst.HORSTLion, dict(lr=1e-3, weight_decay=0.1, alpha=20.0, beta=0.5, order="sm", maximize=True)),
        (horst.HORSTSGD, dict(lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=0.1, alpha=5.0, beta=0.5)),
        (horst.HORSTSGD, dict(lr=1e-2, momentum=0.9, nesterov=True, alpha=5.0, beta=0.5, order="sm")),
        (horst.HORSTSGD, dict(lr=1e-2, alpha=5.0, beta=0.5)),
    ],
    ids=["lion", "lion-sm-maximize", "sgd-momentum", "sgd-nesterov-sm", "sgd"],
)
def test_lion_and_sgd_fast_path_match_plain_path(cls, kwargs, fast_path):
    fast, _ = run(lambda ps: cls(ps, fused=True, **kwargs), steps=20)
    plain, _ = run(lambda ps: cls(ps, fused=False, **kwargs), steps=20)
    assert_close(fast, plain)


def test_ham_nan_guard_on_the_fast_path(fast_path):
    results = {}
    for fused in (True, False):
        param = torch.nn.Parameter(torch.ones(3, 4))
        optimizer = horst.HAM([param], lr=1e-3, fused=fused)
        param.grad = torch.full((3, 4), 0.5)
        param.grad[1, 2] = float("nan")
        optimizer.step()
        results[fused] = param.detach().clone()
    assert results[True][1, 2] == 1.0 and torch.isfinite(results[True]).all()
    assert_close([results[True]], [results[False]])


# ------------------------------------------------------------------------------ the kernel's cache


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    """One build of the kernel into a cache folder (a build takes seconds), copied per test."""
    folder = tmp_path_factory.mktemp("built") / "cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HORST_CACHE_DIR", str(folder))
        _cpu_kernel.build()
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch, built_cache):
    """A cache folder holding a sound build (``build()`` returns it without compiling)."""
    folder = tmp_path / "cache"
    shutil.copytree(built_cache, folder)
    folder.chmod(0o700)
    monkeypatch.setenv("HORST_CACHE_DIR", str(folder))
    return folder


def test_cpu_kernel_build_is_cached(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HORST_CACHE_DIR", str(cache))
    first = _cpu_kernel.build()
    assert first.parent == cache
    built = first.stat().st_mtime_ns
    assert _cpu_kernel.build() == first and first.stat().st_mtime_ns == built
    # the library, its build lock and its content hash, no temporary left behind
    assert sorted(p.name for p in cache.iterdir()) == [first.name, first.name + ".lock", first.name + ".sha256"]
    assert _cpu_kernel.hash_record(first).read_text().strip() == hashlib.sha256(first.read_bytes()).hexdigest()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700


def _rebuilt_privately(cache: Path, reason: str) -> Path:
    with pytest.warns(_cpu_kernel.KernelCacheWarning, match=reason) as caught:
        library = _cpu_kernel.build()
    assert len(caught) == 1 and "\n" not in str(caught[0].message)  # one line
    assert library.parent != cache and cache not in library.parents
    private = library.parent
    assert private.stat().st_uid == os.geteuid() and stat.S_IMODE(private.stat().st_mode) == 0o700
    assert _cpu_kernel.cached_build_problem(library) is None  # the private build is sound
    ctypes.CDLL(str(library)).horst_mirror_step_f32  # noqa: B018 - and loads
    return library


def test_cpu_kernel_cache_writable_by_others_is_not_used(cache):
    cached = _cpu_kernel.build()
    assert cached.parent == cache  # the sound copy is used as it is
    cache.chmod(0o777)
    _rebuilt_privately(cache, "writable by group or others")
    assert cached.exists()


def test_cpu_kernel_cache_owned_by_another_user_is_not_used(cache):
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    _cpu_kernel.build()
    os.chown(cache, 12345, -1)
    _rebuilt_privately(cache, "owned by uid 12345")


def test_cpu_kernel_library_owned_by_another_user_is_not_loaded(cache):
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    cached = _cpu_kernel.build()
    os.chown(cached, 12345, -1)
    _rebuilt_privately(cache, "owned by uid 12345")


def test_cpu_kernel_library_writable_by_group_is_not_loaded(cache):
    cached = _cpu_kernel.build()
    cached.chmod(0o775)
    _rebuilt_privately(cache, "writable by group or others")


def test_cpu_kernel_library_with_another_content_is_not_loaded(cache):
    cached = _cpu_kernel.build()
    with cached.open("ab") as library:  # a library swapped or changed after it was built
        library.write(b"\0")
    assert _rebuilt_privately(cache, "does not match the content hash") != cached


def test_cpu_kernel_library_without_hash_record_is_not_loaded(cache):
    cached = _cpu_kernel.build()
    _cpu_kernel.hash_record(cached).unlink()
    _rebuilt_privately(cache, "no recorded content hash")


def test_cpu_kernel_build_failure_falls_back_loudly(tmp_path, monkeypatch):
    monkeypatch.setenv("HORST_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setattr(_fast_path, "_failed", set())
    _cpu_kernel._kernel.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="C kernel fast path failed.*no C compiler 'no-such-compiler'"):
            fast, _ = run(horst_factory("ms", fused=True), steps=3, lrs=LRS)
    finally:
        _cpu_kernel._kernel.cache_clear()  # later tests load the real build again
    plain, _ = run(horst_factory("ms", fused=False), steps=3, lrs=LRS)
    assert_close(fast, plain)


def test_float64_fast_path_is_float64_exact():
    """float64 tensors take the compiled path with float64 scalars (they were packed in float32,
    which left the fast path 1.5e-7 from AdamW)."""
    adamw, _ = run(
        lambda ps: torch.optim.AdamW(ps, lr=LRS[0], betas=HYPER["betas"], weight_decay=HYPER["wd"]),
        steps=20,
        lrs=LRS,
        dtype=torch.float64,
    )
    fast, _ = run(horst_factory("ms", fused=True, alpha=0.0, beta=0.0), steps=20, lrs=LRS, dtype=torch.float64)
    assert_close(fast, adamw, tol=1e-13)
    fast, _ = run(horst_factory("ms", fused=True), steps=20, lrs=LRS, dtype=torch.float64)
    plain, _ = run(horst_factory("ms", fused=False), steps=20, lrs=LRS, dtype=torch.float64)
    assert fast[0].dtype == torch.float64
    assert_close(fast, plain, tol=1e-13)


def test_compiled_path_steps_all_tensors_in_one_call(monkeypatch):
    """Off the C kernel (CUDA's path) one compiled call steps every tensor: small tensors of one
    device and dtype enter it as one set of flat copies, mirrored or not, whatever their shapes
    and memory layouts (a gradient laid out unlike its parameter too); a 0-d tensor and a large
    one on their own memory. The result is the plain path's (HAM: with its norm cap acting, on
    the flat copy)."""
    calls = []
    compiled = _fast_path._compiled_kernel()
    monkeypatch.setattr(
        _fast_path,
        "_compiled_kernel",
        lambda: lambda *args: calls.append(sorted(entry[0][0].numel() for entry in args[1])) or compiled(*args),
    )
    monkeypatch.setattr(_cpu_kernel, "supports", lambda tensors: False)
    generator = torch.Generator().manual_seed(0)
    shapes = [(6, 5), (5,), (3, 2, 4), (6, 5), (5,), (), (_fast_path.FLAT_NUMEL,)]
    initial = [torch.randn(shape, generator=generator) for shape in shapes]
    initial[3] = initial[3].t().contiguous().t()  # dense, not contiguous
    grads = [[torch.randn(shape, generator=generator) for shape in shapes] for _ in range(3)]
    results = {}
    for fused in (True, False):
        params = [torch.nn.Parameter(t.clone().as_strided(t.shape, t.stride())) for t in initial]
        optimizer = horst.HAM(params, lr=1e-3, max_norm=3.0, fused=fused)
        for step_grads in grads:
            for index, (p, g) in enumerate(zip(params, step_grads)):
                # in the parameter's layout, but one contiguous for the transposed parameter
                p.grad = g.clone() if index == 3 else torch.empty_like(p).copy_(g)
            optimizer.step()
        results[fused] = [p.detach().clone() for p in params]
    # per step one call: the 2-D, 3-D and 1-D tensors as one flat set, the 0-d and the large one
    assert calls == [[1, 30 + 30 + 24 + 5 + 5, _fast_path.FLAT_NUMEL]] * 3
    assert_close(results[True], results[False])
    assert any(p.norm() > 3.0 for p in initial[:5]) and all(p.norm() <= 3.0 + 1e-5 for p in results[True])
    assert results[True][3].stride() == initial[3].stride()


def test_flat_copies_kept_between_steps_follow_the_gradients_present(monkeypatch):
    """The compiled path keeps its flat copies of small tensors from step to step, per layout:
    a step where some parameters have no gradient (another layout) and the steps after it
    match the plain path, and at most ``KEPT_LAYOUTS`` layouts are kept."""
    monkeypatch.setattr(_cpu_kernel, "supports", lambda tensors: False)
    monkeypatch.setattr(_fast_path, "KEPT_LAYOUTS", 2)
    generator = torch.Generator().manual_seed(0)
    shapes = [(4, 3), (3,), (4, 3), (2, 2, 2), (3,)]
    initial = [torch.randn(shape, generator=generator) for shape in shapes]
    # the parameters with a gradient at each step: three layouts, the first one again at the end
    present = [range(5), range(5), [0, 1, 3], [1, 2, 4], range(5), range(5)]
    grads = [[torch.randn(shape, generator=generator) for shape in shapes] for _ in present]
    results, optimizers = {}, {}
    for fused in (True, False):
        params = [torch.nn.Parameter(t.clone()) for t in initial]
        optimizers[fused] = optimizer = horst.HORST(params, lr=1e-2, alpha=20.0, beta=0.5, fused=fused)
        for indices, step_grads in zip(present, grads):
            for index, (p, g) in enumerate(zip(params, step_grads)):
                p.grad = g.clone() if index in indices else None
            optimizer.step()
        results[fused] = [p.detach().clone() for p in params]
    assert_close(results[True], results[False])
    assert len(optimizers[True]._flat_buffers) == 2 and not optimizers[False]._flat_buffers


def test_one_compiled_call_over_many_tensors_is_each_tensor_alone_and_the_plain_path(monkeypatch):
    """Off the C kernel (CUDA's path), one compiled call over many tensors of mixed sizes,
    layouts, dtypes and mirror flags (small ones as flat copies, large ones in place, a 0-d one)
    gives each tensor bit for bit what the compiled kernel gives it when it is stepped alone (the
    same arithmetic per element), and the plain path's result within float32 rounding (1e-6, the
    other fast-path tests' tolerance; bf16 within one rounding of bf16, 2**-8 relative: the
    compiled kernel fuses the float32 arithmetic it stores from differently from eager)."""
    monkeypatch.setattr(_cpu_kernel, "supports", lambda tensors: False)
    calls = []
    compiled = _fast_path._compiled_kernel()
    monkeypatch.setattr(
        _fast_path, "_compiled_kernel", lambda: lambda *args: calls.append(len(args[1])) or compiled(*args)
    )
    generator = torch.Generator().manual_seed(0)
    shapes = [(), (5,), (3, 4), (6, 5), (2, 3, 4), (_fast_path.FLAT_NUMEL + 3,), (300, 230)]
    initial = []
    for dtype in (torch.float32, torch.bfloat16):
        for shape in shapes:
            tensor = torch.randn(shape, generator=generator).to(dtype)
            initial.append(tensor.t().contiguous().t() if len(shape) == 2 else tensor)  # dense, transposed
    grads = [[torch.randn(t.shape, generator=generator).to(t.dtype) for t in initial] for _ in range(3)]

    def train(fused: bool, alone: bool) -> list[torch.Tensor]:
        params = [torch.nn.Parameter(t.clone().as_strided(t.shape, t.stride())) for t in initial]
        make = lambda ps: horst.HORST(ps, lr=1e-2, alpha=20.0, beta=0.5, fused=fused)  # noqa: E731
        optimizers = [make([p]) for p in params] if alone else [make(params)]
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = torch.empty_like(p).copy_(g)
            for optimizer in optimizers:
                optimizer.step()
        return [p.detach().clone() for p in params]

    together = train(fused=True, alone=False)
    assert calls == [2 * (1 + 3)] * 3  # per step one call: per dtype a flat set, the 0-d and the two large ones
    alone = train(fused=True, alone=True)
    plain = train(fused=False, alone=False)
    for a, b, c, start in zip(together, alone, plain, initial):
        assert a.dtype == start.dtype and a.stride() == start.stride()
        assert torch.equal(a, b)
        tol = 1e-6 if a.dtype == torch.float32 else 2**-8
        torch.testing.assert_close(a.double(), c.double(), atol=tol, rtol=tol)
        assert not torch.equal(a, start)
