"""Test-wide environment: offline hubs, offline W&B, and the plain optimizer path.

horst's fast paths build a C kernel or compile a graph with torch.compile (seconds per
process); tests use the plain path except those that ask for ``fused=True`` explicitly.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

# Before torch is imported: OpenMP threads that spin-wait cost a lot on 2 shared cores
# (CI runs the suite on 2 cores; the pruning tests ran 2.6x faster with this).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # wandb's crash reports would try the network
os.environ["HORST_FUSED"] = "0"

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def compose_job(config_name: str, overrides: list[str]) -> dict:
    """The job config a run records in config.yaml (Hydra's compose, resolved; no hydra node)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from training.gpt2.config import register_configs as register_gpt2
    from training.vit.config import register_configs as register_vit

    register_vit(), register_gpt2()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return OmegaConf.to_container(compose(config_name, overrides=overrides), resolve=True)


@pytest.fixture(scope="session")
def compose():
    """compose(config_name, overrides) -> the job config a run would record."""
    return compose_job


@pytest.fixture(scope="session")
def job_configs() -> dict[str, dict]:
    """Composed configs of both pipelines' arms, by (pipeline, arm)."""
    arms = ("adamw", "ham", "horst", "horst_prunable", "adamw_decay")
    return {(p, a): compose_job(f"train_{p}", [f"+arm={a}"]) for p in ("vit", "gpt2") for a in arms}


@pytest.fixture
def write_run():
    """write_run(folder, config, value, sparsities=None) -> folder: config.yaml and summary.json as
    the pipelines write them; ViT: `value` is the final top-1 (fraction) at acdc.sparsity; GPT-2:
    `value` is the dense perplexity, each pruned sparsity s multiplies it by 1 + s."""

    def write(folder: Path, config: dict, value: float, *, git_commit: str = "0" * 40, **summary: object) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        pipeline = "vit" if "acdc" in config else "gpt2"
        record = {"pipeline": pipeline, "git_commit": git_commit, "wall_time_s": 1.0,
                  "eval_split": config.get("eval_split", "validation")}  # fmt: skip
        if pipeline == "vit":
            record |= {"target_sparsity": config["acdc"]["sparsity"], "top1": value, "acdc": {"pattern": "unstructured"}}
        else:
            rows = [{"sparsity": s, "method": "none" if s == 0 else "magnitude", "pattern": "dense" if s == 0 else "unstructured",
                     "ppl": value * (1 + s)} for s in config["prune"]["sparsities"]]  # fmt: skip
            record |= {"pruning": {"results": rows}}
        (folder / "summary.json").write_text(json.dumps(record | summary))
        return folder

    return write

# ---- the real SLURM cluster of scripts/slurm_cluster.sh (tests/test_slurm_*.py) ---------------
SLURM_CLUSTER_HINT = "SLURM test cluster not running; enable with: bash scripts/slurm_cluster.sh install && bash scripts/slurm_cluster.sh start (as root)"


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """The node of the running single-node cluster (scripts/slurm_cluster.sh), or a skip saying how to start it."""
    if shutil.which("sinfo") is None:
        pytest.skip(SLURM_CLUSTER_HINT)
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30)
    partitions = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=30)
    ready = [line.split()[0] for line in nodes.stdout.splitlines() if line.split()[1] in ("idle", "mixed", "allocated")]
    if nodes.returncode or not ready or "urgent" not in partitions.stdout.split():
        pytest.skip(SLURM_CLUSTER_HINT)
    return ready[0]
