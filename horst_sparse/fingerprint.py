"""`horst-sparse fingerprint` (make fingerprint): the bits of two short runs in the reproducible CPU mode.

A ViT and a GPT-2 run of the embedded recipes (the smoke presets: every AC/DC phase, HORST, its C
kernel for GPT-2), each through its entry point in a fresh process, reduced to hashes of their
final weights and of their loss curves (every logged training loss, as the float it is), with the
curves themselves so that a mismatch names the first step that differs. The committed
`results/fingerprint.json` names the machine it was made on; `tests/test_fingerprint.py` measures
the same runs and asks for the same bits: trivial on that machine, the real check on any other x86
CPU (horst_sparse.cpu_mode says what the mode pins and why).

    horst-sparse fingerprint                 # measure and compare with results/fingerprint.json; 1 on a mismatch
    horst-sparse fingerprint --write         # measure and write it (a clean tree: it records the commit)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from horst_sparse.paths import REPO

COMMITTED = REPO / "results" / "fingerprint.json"


def runs() -> dict[str, list[str]]:
    """Each registered pipeline's run: its smoke preset (configs/experiment/smoke_<pipeline>.yaml, over its
    embedded recipe) with HORST, at the recipe's own thread count."""
    from horst_sparse.pipeline import get, names

    return {name: [get(name).script, f"experiment=smoke_{name}", "optimizer=horst"] for name in names()}


COMMON = ["logging.mode=disabled", "resume=never", "train.log_interval=1"]  # every step's loss
# HORST's fast path on (the GPT-2 recipe's C kernel; the ViT recipes set HORST_FUSED=0 themselves)
ENVIRONMENT = {"HORST_FUSED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
LOSS = "train/loss"


def weights_hash(checkpoint: Path) -> str:
    """sha256 over the model's tensors in the checkpoint, in name order: names, dtypes, shapes, bytes."""
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["model"]
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().contiguous()
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def loss_curve(run_dir: Path) -> dict[str, str]:
    """{step: loss} of every logged training loss, the loss as float.hex (every bit of it)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {str(row["step"]): float(row[LOSS]).hex() for row in rows if LOSS in row}


def measure_run(pipeline: str, scratch: Path) -> dict[str, Any]:
    """Run one of `runs()` in a fresh process into `scratch`; its fingerprint and where it ran."""
    from horst_sparse.training.checkpoint import latest_checkpoint

    line = [sys.executable, *runs()[pipeline], *COMMON, f"hydra.run.dir={scratch}"]
    env = {**os.environ, **ENVIRONMENT}
    env.pop("HORST_CPU_MODE", None)  # the reproducible mode, whatever this shell says
    done = subprocess.run(line, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: the {pipeline} run failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    summary = json.loads((scratch / "summary.json").read_text())
    environment = summary["environment"]
    curve = loss_curve(scratch)
    return {
        "command": " ".join(["python", *runs()[pipeline], *COMMON]),
        "weights_sha256": weights_hash(latest_checkpoint(scratch)),
        "loss_curve_sha256": hashlib.sha256(json.dumps(curve).encode()).hexdigest(),
        "loss_curve": curve,
        "machine": {
            "cpu": environment["cpu"],
            "cpu_mode": environment["cpu_mode"],
            "torch": environment["versions"]["torch"],
        },
    }


def measure(scratch: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every run of `runs()`, measured one after another, in scratch/<pipeline> (a temporary folder by default)."""
    if scratch is None:
        with tempfile.TemporaryDirectory(prefix="fingerprint-") as folder:
            return measure(Path(folder))
    return {pipeline: measure_run(pipeline, scratch / pipeline) for pipeline in runs()}


def differences(committed: dict[str, Any], measured: dict[str, Any]) -> list[str]:
    """One line per run whose bits differ from the committed ones (none when all agree): the first
    step whose loss differs, or that the weights alone differ."""
    lines = []
    for pipeline, now in measured.items():
        then = committed.get(pipeline)
        if then is None:
            lines.append(f"{pipeline}: not in the committed fingerprint")
            continue
        if (then["weights_sha256"], then["loss_curve_sha256"]) == (now["weights_sha256"], now["loss_curve_sha256"]):
            continue
        before, after = then["loss_curve"], now["loss_curve"]
        step = next((s for s in before if before[s] != after.get(s)), None)
        where = (
            f"the loss first differs at step {step} ({float.fromhex(before[step])!r} committed, "
            f"{float.fromhex(after[step])!r} here)"
            if step is not None and step in after
            else "the loss curves agree, the final weights do not"
            if before.keys() == after.keys()
            else "the loss curves have other steps"
        )
        lines.append(
            f"{pipeline}: {where}; committed on {then['machine']['cpu']} "
            f"({_mode_text(then['machine']['cpu_mode'])}), measured on {now['machine']['cpu']} "
            f"({_mode_text(now['machine']['cpu_mode'])})"
        )
    return lines


def _mode_text(mode: dict[str, Any]) -> str:
    state = "reproducible mode" if mode.get("reproducible") else "NOT in the reproducible mode"
    return f"{state}, MKL {mode.get('mkl_cbwr')}, ATen {mode.get('aten_capability')}, {mode.get('threads')} thread(s)"


def main(argv: Sequence[str] | None = None) -> None:
    from horst_sparse.cli import subcommand

    parser = subcommand("fingerprint", __doc__)
    parser.add_argument("--write", action="store_true", help=f"write {COMMITTED.relative_to(REPO)} (clean tree)")
    args = parser.parse_args(argv)
    from horst_sparse.study.jobs import StudyError
    from horst_sparse.study.provenance import check_clean
    from horst_sparse.training.run_log import git_commit

    if args.write:
        try:
            check_clean()
        except StudyError as error:
            sys.exit(f"error: {error}")
    elif not COMMITTED.is_file():
        sys.exit(f"error: no committed fingerprint {COMMITTED}: `horst-sparse fingerprint --write` makes one")
    measured = measure()
    for pipeline, run in measured.items():
        print(
            f"{pipeline}: weights {run['weights_sha256'][:16]}, loss curve {run['loss_curve_sha256'][:16]} "
            f"({len(run['loss_curve'])} losses) on {run['machine']['cpu']} ({_mode_text(run['machine']['cpu_mode'])})"
        )
    if args.write:
        record = {"made_by": "horst-sparse fingerprint --write", "git_commit": git_commit(REPO), **measured}
        COMMITTED.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {COMMITTED.relative_to(REPO)}")
        return
    committed = json.loads(COMMITTED.read_text())
    lines = differences(committed, measured)
    for line in lines:
        print(f"DIFFERS: {line}")
    print(
        "the same bits as the committed fingerprint"
        if not lines
        else f"{len(lines)} of {len(measured)} runs differ from {COMMITTED.relative_to(REPO)}"
    )
    sys.exit(int(bool(lines)))


if __name__ == "__main__":
    main()
