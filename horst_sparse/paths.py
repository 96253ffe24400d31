"""Where the repository's own folders are, said once (the configs and results are not installed:
they live beside the entry points, `train_vit.py` and `train_gpt2.py`)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
RESULTS = REPO / "results"
