"""The reproducible CPU mode: every math library's code path pinned, so that a CPU run gives the
same bits on any x86-64 CPU with AVX2 and FMA, Intel or AMD, at the same thread count.

Each library picks its kernels by the CPU it finds, so the same seed's run differs in its last bits
from one CPU to another, and a run near a stability edge trains on one and diverges on another:

* MKL (torch's BLAS): `MKL_CBWR=COMPATIBLE,STRICT`, MKL's conditional numerical reproducibility.
  Only the COMPATIBLE branch is the same on Intel and non-Intel CPUs (oneMKL's developer guide: a
  named ISA branch such as AVX2 falls back to AUTO on a non-Intel CPU); STRICT makes its results
  independent of the data's alignment.
* ATen's vectorised kernels (softmax, layer norm, reductions, ...) and the C kernel of horst's fast
  path, compiled for the capability ATen reports: `ATEN_CPU_CAPABILITY=avx2`.
* oneDNN (convolutions, GELU): `ONEDNN_MAX_CPU_ISA=AVX2`.
* numpy's SIMD loops (the data sets it generates): `NPY_ENABLE_CPU_FEATURES=X86_V3` (AVX2 + FMA).

Each is read once, when its library starts, so `pin()` must run before torch (and numpy) are
imported: `horst_sparse/__init__.py` calls it, so every process that runs a pipeline (an entry
point, a launcher's worker unpickling its task, torchrun's ranks) is pinned, and subprocesses
inherit it (so a launcher's worker that loads numpy before horst_sparse is pinned too). `HORST_CPU_MODE=native` leaves every library to its own choice (the fastest code for
this CPU, bits that are this CPU's). The thread count is the run's `cpu_threads`; summation order
follows it, so the same bits need the same count.

`state()` says, after torch is imported, which paths are in force (read back from MKL and ATen,
not assumed), and `problem()` why a run that requires the mode (`reproducible_cpu: true`, as the
embedded recipes set it) cannot have it here. GPU kernels are not covered."""

from __future__ import annotations

import os
import sys
from pathlib import Path

MODE_VARIABLE = "HORST_CPU_MODE"  # "reproducible" (the default) or "native"
PINS = {
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "NPY_ENABLE_CPU_FEATURES": "X86_V3",
}
NEEDED_FLAGS = ("avx2", "fma")  # /proc/cpuinfo's names of what the pinned paths execute
# mkl_service.h: the branch field and the values read back under PINS' MKL_CBWR
MKL_CBWR_ALL, MKL_CBWR_COMPATIBLE, MKL_CBWR_STRICT = -1, 3, 0x10000
_pinned: dict[str, object] = {}  # what pin() did in this process: for state()


def missing_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The instruction sets the pinned paths need that this CPU lacks (none where it has them;
    every flag where the CPU is not x86 or says nothing)."""
    try:
        flags = next(
            (line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines() if line.startswith("flags")),
            [],
        )
    except OSError:
        flags = []
    return [flag for flag in NEEDED_FLAGS if flag not in flags]


def wanted() -> bool:
    """Whether this process is to run in the reproducible mode ($HORST_CPU_MODE, default yes)."""
    mode = os.environ.get(MODE_VARIABLE, "reproducible")
    if mode not in ("reproducible", "native"):
        raise SystemExit(f"error: {MODE_VARIABLE}={mode!r}: use reproducible (the default) or native")
    return mode == "reproducible"


def pin() -> None:
    """Set PINS in this process's environment, before torch and numpy read them (once a process)."""
    if _pinned:
        return
    _pinned["wanted"] = wanted()
    _pinned["missing_flags"] = missing_cpu_flags() if _pinned["wanted"] else []
    # a library loaded before this call read the environment the process started with: too late,
    # unless that environment was pinned already (a launcher's worker, forked by a pinned process)
    inherited = all(os.environ.get(name) == value for name, value in PINS.items())
    _pinned["too_late"] = [] if inherited else sorted(m for m in ("torch", "numpy") if m in sys.modules)
    if _pinned["wanted"] and not _pinned["missing_flags"]:
        os.environ.update(PINS)
    elif not _pinned["wanted"]:  # native: drop the pins a pinned parent passed down (a value of the user's stays)
        for name, value in PINS.items():
            if os.environ.get(name) == value:
                del os.environ[name]


def _mkl_branch() -> int | None:
    """MKL's CNR setting as MKL reads it back (mkl_cbwr_get); None where torch's MKL is not found."""
    import ctypes

    import torch

    try:
        library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        return int(library.mkl_serv_cbwr_get(MKL_CBWR_ALL))
    except (OSError, AttributeError):
        return None


def _numpy_dispatch() -> list[str]:
    """The SIMD targets numpy's loops dispatch to here, beyond its build's baseline."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    return [target for target in __cpu_dispatch__ if __cpu_features__.get(target)]


def state() -> dict[str, object]:
    """The CPU mode in force in this process: `reproducible` (bool) and what each library runs, read
    back where the library says (MKL's branch, ATen's capability, numpy's features)."""
    import torch

    mkl = _mkl_branch()
    found = {
        "mkl_cbwr": None if mkl is None else hex(mkl),
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "numpy_dispatch": " ".join(_numpy_dispatch()),
        "threads": torch.get_num_threads(),
    }
    return {"reproducible": not _reasons(found), **found}


def _reasons(found: dict[str, object]) -> list[str]:
    reasons = []
    if not _pinned.get("wanted", wanted()):
        reasons.append(f"{MODE_VARIABLE}=native")
    if _pinned.get("missing_flags"):
        reasons.append(f"this CPU lacks {' and '.join(_pinned['missing_flags'])}, which the pinned code paths need")
    if _pinned.get("too_late"):
        reasons.append(f"{' and '.join(_pinned['too_late'])} was imported before horst_sparse pinned it")
    if found["mkl_cbwr"] != hex(MKL_CBWR_COMPATIBLE | MKL_CBWR_STRICT):
        reasons.append(f"MKL's branch is {found['mkl_cbwr']} (MKL_CBWR={os.environ.get('MKL_CBWR')!r})")
    if found["aten_capability"] != "AVX2":
        reasons.append(f"ATen dispatches to {found['aten_capability']}")
    if found["onednn_max_isa"] != PINS["ONEDNN_MAX_CPU_ISA"]:
        reasons.append(f"ONEDNN_MAX_CPU_ISA is {found['onednn_max_isa']!r}")
    if found["numpy_dispatch"] != PINS["NPY_ENABLE_CPU_FEATURES"]:
        reasons.append(f"numpy dispatches to {found['numpy_dispatch'] or 'its baseline only'}")
    return list(dict.fromkeys(reasons))


def problem() -> str | None:
    """Why this process is not in the reproducible mode, as one sentence with the fix; None where it is."""
    reasons = _reasons(state())
    if not reasons:
        return None
    return (
        f"the reproducible CPU mode is not in force ({'; '.join(reasons)}): start the run through its entry "
        f"point (python train_vit.py / train_gpt2.py, which import horst_sparse before torch) without "
        f"{MODE_VARIABLE}=native, or give reproducible_cpu=false to run on this CPU's own code paths"
    )
