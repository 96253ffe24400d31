"""Test-wide environment: offline hubs, offline W&B, and the plain optimizer path.

The torch.compile fast path of horst costs seconds of compilation per process; tests use
the plain path (same code, eager) except those that ask for ``fused=True`` explicitly.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ["HORST_FUSED"] = "0"
