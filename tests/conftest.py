"""Test-wide environment: offline hubs, offline W&B, and the plain optimizer path.

horst's fast paths build a C kernel or compile a graph with torch.compile (seconds per
process); tests use the plain path except those that ask for ``fused=True`` explicitly.
"""

import os

# Before torch is imported: OpenMP threads that spin-wait cost a lot on 2 shared cores
# (CI runs the suite on 2 cores; the pruning tests ran 2.6x faster with this).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # wandb's crash reports would try the network
os.environ["HORST_FUSED"] = "0"


# ---- the real SLURM cluster of scripts/slurm_cluster.sh (tests/test_slurm_*.py) ---------------
import shutil  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402

SLURM_CLUSTER_HINT = "SLURM test cluster not running; enable with: bash scripts/slurm_cluster.sh install && bash scripts/slurm_cluster.sh start (as root)"


def slurm_cluster_node() -> str | None:
    """The node of the running single-node test cluster (scripts/slurm_cluster.sh), else None."""
    if shutil.which("sinfo") is None:
        return None
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30)
    partitions = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=30)
    ready = [line.split()[0] for line in nodes.stdout.splitlines() if line.split()[1] in ("idle", "mixed", "allocated")]
    return ready[0] if not nodes.returncode and ready and "urgent" in partitions.stdout.split() else None


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """The test cluster's node; the SLURM test modules skip as a whole without it (one line saying how to start it)."""
    node = slurm_cluster_node()
    if node is None:
        pytest.skip(SLURM_CLUSTER_HINT)
    return node
