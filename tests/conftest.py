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
