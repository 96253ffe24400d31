"""What every benchmark's header records: the commit it measured (`git describe`, `-dirty` for
uncommitted changes). Imported by the bench/ scripts, which run as `python bench/<name>.py`."""

from __future__ import annotations

import subprocess
from pathlib import Path


def commit() -> str:
    described = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--exclude=*"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return described.stdout.strip() or "unknown"
