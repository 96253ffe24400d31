"""The CPU fast path: ``_cpu_kernel.c`` compiled once per machine and called through ctypes.

``torch.compile`` of ``horst.functional.mirror_step_`` is correct on CPU but slow there: with
dynamic shapes its kernel takes ~2x the time of ``torch.optim.AdamW(fused=True)``, and each call
costs ~0.2 ms of guards and wrappers, 30 ms a step for GPT-2's 148 tensors. This kernel does
the same update in one vectorised pass per tensor and one call per batch of tensors that share
the step's scalars (``bench/optimizer_step.py``), for every base (AdamW, Lion, SGD). It serves
float32 CPU tensors in a dense layout (contiguous, channels_last, ...); everything else (CUDA,
bf16) takes the compiled path. It takes the scalars as packed in ``horst.functional.SCALARS``
order; its enum names them in the same order.

The shared library is built with the system C compiler (``$CC``, else ``cc``; the compiler
inductor needs on CPU anyway) into ``$HORST_CACHE_DIR`` (default ``$XDG_CACHE_HOME/horst`` or
``~/.cache/horst``), named by a hash of the source, the flags and the compiler, so that a
changed source or another CPU type (a shared home directory on a cluster) never loads a stale
or foreign build. A build is loaded only from a folder owned by the user and not writable by
group or others, only if the file is so too, and only if its content hash matches the one
recorded next to it when it was built; otherwise it is rebuilt in a private temporary folder,
with a one-line warning (``KernelCacheWarning``).

Many processes may start at once on one cache (torchrun's ranks, a job array on a shared home):
a POSIX lock on ``<library>.lock`` (``fcntl.lockf``, which NFS honours) lets one of them build
while the others wait and then load its build, and a build is written to a temporary file in
the cache folder and renamed into place, so that no process ever sees half a library.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("_cpu_kernel.c")
# vectorisation flags for the ISA torch's own CPU kernels use on this machine
ISA_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mavx2", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}
BLOCK = 1 << 15  # elements per unit of work of a thread (128 KiB of each stream)
# -funroll-loops: 7 % faster with one thread (interleaves the division and square-root chains)
BASE_FLAGS = ["-O3", "-funroll-loops", "-fno-math-errno", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC"]


# the kernel's bases and mirror modes: its enums, in their order
BASE_ADAMW, BASE_LION, BASE_SGD, BASE_SGD_MOMENTUM, BASE_SGD_NESTEROV = range(5)
MODE_NO_MIRROR, MODE_MS_UPDATE, MODE_SM, MODE_MS_GRADIENT, MODE_MS_GRADIENT_GUARDED = range(5)


class KernelBuildError(RuntimeError):
    pass


class KernelCacheWarning(UserWarning):
    """The cached build could not be trusted; the kernel was built in a private folder."""


def cache_dir() -> Path:
    if "HORST_CACHE_DIR" in os.environ:
        return Path(os.environ["HORST_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "horst"


def _compiler() -> str:
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise KernelBuildError(f"no C compiler {compiler!r} on PATH (set CC)")
    return compiler


def _flags() -> list[str]:
    return BASE_FLAGS + ISA_FLAGS.get(torch.backends.cpu.get_cpu_capability(), [])


def untrusted(path: Path) -> str | None:
    """Why ``path`` (a folder or a file) is not to be trusted, or None: it must be owned by this
    user and not writable by group or others."""
    info = path.stat()
    if info.st_uid != os.geteuid():
        return f"{path} is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {stat.filemode(info.st_mode)})"
    return None


def content_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hash_record(library: Path) -> Path:
    """The file holding the content hash of ``library`` recorded when it was built."""
    return library.with_name(library.name + ".sha256")


def cached_build_problem(library: Path) -> str | None:
    """Why the cached ``library`` is not to be loaded, or None."""
    record = hash_record(library)
    if not record.exists():
        return f"{library} has no recorded content hash"
    problem = untrusted(library) or untrusted(record)
    if problem is None and record.read_text().strip() != content_hash(library):
        problem = f"{library} does not match the content hash recorded when it was built"
    return problem


def build(source: Path = SOURCE, flags: list[str] | None = None, stem: str = "horst_cpu_kernel") -> Path:
    """The path of the compiled ``source`` (this kernel by default; ``flags`` default to
    ``_flags()``): the trusted cached build, or a new one named ``<stem>_<hash>.so``."""
    compiler = _compiler()
    flags = _flags() if flags is None else flags
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([source.read_text(), *flags, version]).encode()).hexdigest()[:16]
    name = f"{stem}_{key}.so"
    folder = cache_dir()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = untrusted(folder)
        library = folder / name
        if problem is None:
            with _exclusive(folder / f"{name}.lock"):  # one process builds, the others wait for its build
                if not library.exists():
                    return _compile(compiler, flags, source, library)
                problem = cached_build_problem(library)
        if problem is None:
            return library
    except OSError as error:
        problem = f"{folder}: {error}"
    warnings.warn(
        f"horst: not loading the C kernel from the cache ({problem}); building it in a private folder",
        KernelCacheWarning,
        stacklevel=2,
    )
    return _compile(compiler, flags, source, _private_dir() / name)


@contextlib.contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    """Holds an exclusive POSIX lock on the file ``lock`` (created if missing), waiting for it."""
    import fcntl  # POSIX only, as is the C compiler this module calls

    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.lockf(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


@functools.cache
def _private_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="horst-kernel-"))  # mode 0700, removed with the machine's /tmp


def _compile(compiler: str, flags: list[str], source: Path, library: Path) -> Path:
    # build next to the target and rename: a process that loads the library sees all of it or none
    with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
        partial = Path(tmp) / library.name
        result = subprocess.run([compiler, *flags, str(source), "-o", str(partial)], capture_output=True, text=True)
        if result.returncode != 0:
            raise KernelBuildError(f"{compiler} failed on {source.name}:\n{result.stderr.strip()}")
        os.chmod(partial, 0o755)
        record = Path(tmp) / hash_record(library).name
        record.write_text(content_hash(partial) + "\n")
        os.replace(record, hash_record(library))
        os.replace(partial, library)
    return library


@functools.cache
def _kernel() -> ctypes.CDLL:
    library = ctypes.CDLL(str(build()))
    function = library.horst_mirror_step_f32
    pointers = ctypes.POINTER(ctypes.c_void_p)
    function.argtypes = [
        ctypes.c_int64,
        pointers,
        pointers,
        pointers,
        pointers,
        ctypes.POINTER(ctypes.c_int64),
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_int64),
        ctypes.POINTER(ctypes.c_float),
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_double),
    ]
    function.restype = ctypes.c_int
    return function


def supports(tensors: tuple[Tensor, ...]) -> bool:
    """Whether the kernel can update these (param, grad, *state), given that they share a dense
    layout (``horst._fast_path.dense_layout``): the kernel walks ``numel()`` float32 values of
    their memory from ``data_ptr()`` on, in storage order, so each must be a plain CPU tensor
    (no subclass: a DTensor's ``data_ptr()`` is 0 and its ``numel()`` the global one) holding
    memory of its own."""
    return len(tensors) <= 4 and all(
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.device.type == "cpu"
        and t.dtype == torch.float32
        and t.data_ptr() != 0
        for t in tensors
    )


def mirror_step_f32_(
    tensors: list[tuple[Tensor, ...]],
    scalars: tuple[float, ...],
    *,
    base: int,
    mode: int,
    sums_of_squares: bool = False,
) -> list[float] | None:
    """One step over ``(param, grad, *state)`` tuples of dense float32 CPU tensors (``supports``),
    one call. ``scalars`` in ``horst.functional.SCALARS`` order. With ``sums_of_squares``, returns
    each new parameter's sum of squares (computed in double in the same pass)."""
    count = len(tensors)
    columns = list(zip(*tensors))
    columns += [()] * (4 - len(columns))  # bases with fewer state tensors: NULL pointers
    arrays = [
        (ctypes.c_void_p * count)(*(t.data_ptr() for t in column)) if column else (ctypes.c_void_p * count)()
        for column in columns
    ]
    sizes = [t[0].numel() for t in tensors]
    block_starts = [0]
    for size in sizes:  # empty tensors take no block
        block_starts.append(block_starts[-1] + -(-size // BLOCK))
    block_sums = (ctypes.c_double * block_starts[-1])() if sums_of_squares else None
    status = _kernel()(
        count,
        *arrays,
        (ctypes.c_int64 * count)(*sizes),
        BLOCK,
        (ctypes.c_int64 * (count + 1))(*block_starts),
        (ctypes.c_float * len(scalars))(*scalars),
        base,
        mode,
        torch.get_num_threads(),
        block_sums,
    )
    if status != 0:
        raise ValueError(f"C kernel: unknown base {base} or mode {mode}")
    if block_sums is None:
        return None
    return [sum(block_sums[start:end]) for start, end in zip(block_starts, block_starts[1:])]
