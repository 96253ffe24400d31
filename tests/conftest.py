"""Test-wide environment: offline hubs, offline W&B, and the plain optimizer path; the
fixtures and helpers that several test modules share (tests share them here, never by
importing each other).

horst's fast paths build a C kernel or compile a graph with torch.compile (seconds per
process); tests use the plain path except those that ask for ``fused=True`` explicitly.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import horst_sparse  # noqa: F401  (first: it pins the reproducible CPU mode before numpy and torch load)

# isort: split
import numpy as np
import pandas as pd
import pytest
import yaml

if TYPE_CHECKING:
    import torch

# Before torch is imported: OpenMP threads that spin-wait cost a lot on 2 shared cores
# (CI runs the suite on 2 cores; the pruning tests ran 2.6x faster with this).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # wandb's crash reports would try the network
os.environ["HORST_FUSED"] = "0"

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
# The one command, installed beside this Python (horst_sparse/cli.py): [HORST_SPARSE, "plan", ...]
HORST_SPARSE = str(Path(sys.executable).parent / "horst-sparse")


# ---- composed configs and run folders as the pipelines record them (analysis, study, tuning) ----
def compose_job(pipeline: str, overrides: list[str]) -> dict:
    """The job config a run of `pipeline` records in config.yaml (horst_sparse.compose, resolved;
    no hydra node)."""
    from omegaconf import OmegaConf

    from horst_sparse.compose import compose
    from horst_sparse.pipeline import get

    return OmegaConf.to_container(compose(get(pipeline), overrides), resolve=True)


@pytest.fixture(scope="session")
def compose():
    """compose(pipeline, overrides) -> the job config a run of that pipeline would record."""
    return compose_job


@pytest.fixture(scope="session")
def job_configs() -> dict[str, dict]:
    """Composed configs of both pipelines' arms, by (pipeline, arm)."""
    arms = ("adamw", "ham", "horst", "horst_prunable", "adamw_decay")
    return {(p, a): compose_job(p, [f"experiment={a}"]) for p in ("vit", "gpt2") for a in arms}


@pytest.fixture
def write_run():
    """write_run(folder, config, value, sparsities=None) -> folder: config.yaml and summary.json as
    the pipelines write them; ViT: `value` is the final top-1 (fraction) at acdc.sparsity; GPT-2:
    `value` is the dense perplexity, each pruned sparsity s multiplies it by 1 + s."""

    def write(folder: Path, config: dict, value: float, *, git_commit: str = "0" * 40, **summary: object) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        from horst_sparse.pipeline import get

        pipeline = config["pipeline"]
        record = {
            "pipeline": pipeline,
            "git_commit": git_commit,
            "wall_time_s": 1.0,
            "eval_split": config.get("eval_split", "validation"),
        }
        if pipeline == "vit":
            record |= {
                "target_sparsity": config["acdc"]["sparsity"],
                "top1": value,
                "acdc": {"pattern": "unstructured"},
            }
        else:
            rows = [
                {
                    "sparsity": s,
                    "method": "none" if s == 0 else "magnitude",
                    "pattern": "dense" if s == 0 else "unstructured",
                    "ppl": value * (1 + s),
                }
                for s in config["prune"]["sparsities"]
            ]
            record |= {"pruning": {"results": rows}}
        record = record | summary
        record["numbers"] = get(pipeline).numbers(config, record)  # as the runner writes them
        (folder / "summary.json").write_text(json.dumps(record))
        return folder

    return write


# ---- both pipelines end to end: environment, entry points, logs, checkpoints ----------------------
# Offline, no W&B, plain optimizer path; for the runs in-process (quiet_env, quiet_single_threaded)
# and in subprocesses (_subprocess_env).
QUIET_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled", "HORST_FUSED": "0"}


def _load_entry_point(name: str):
    """The entry point `name`.py at the repository root (train_gpt2, train_vit; the root is on
    pytest's `pythonpath`) as a module; its `main` is the Hydra application, run in-process as
    `python <name>.py` runs it."""
    return importlib.import_module(name)


@functools.cache
def register_schemas(pipeline: str) -> None:
    """The pipeline's schemas in Hydra's ConfigStore, which its config's defaults name: once per
    process, as its entry point (train_gpt2.py, train_vit.py) registers them on import."""
    from horst_sparse.pipeline import get

    get(pipeline).configs.register()


def _subprocess_env() -> dict[str, str]:
    return {**os.environ, **QUIET_ENV, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def read_records(run_dir: Path) -> list[dict]:
    """The JSONL log without the fields that depend on wall-clock time or paths."""
    volatile = {"time", "perf/tokens_per_s", "perf/images_per_s", "path"}  # GPT-2's and ViT's throughput
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in volatile} for line in lines]


def final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    from horst_sparse.training.checkpoint import latest_checkpoint, load_checkpoint

    return load_checkpoint(latest_checkpoint(run_dir))["model"]


def logged_steps(run_dir: Path) -> list[int]:
    """The steps of a run's training-loss records so far (whole lines only: the run may be writing one)."""
    path = Path(run_dir) / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return [json.loads(line)["step"] for line in lines if '"train/loss"' in line]


# ---- the GPT-2 pipeline on CPU: the embedded pydoc corpus, a 2-layer model ------------------------
@pytest.fixture(scope="module")
def pydoc_dir(tmp_path_factory) -> Path:
    from horst_sparse.gpt2.data import prepare_pydoc

    folder = tmp_path_factory.mktemp("pydoc")
    prepare_pydoc(folder)
    return folder


@pytest.fixture
def quiet_single_threaded(monkeypatch):
    """Offline, no W&B, plain optimizer path; one thread like the subprocesses of the GPT-2
    tests (the ops of these tiny models are too small to gain from more, and the kill-and-resume
    comparison needs the same kernels in and out of process). The modules that want it for
    every test say `pytestmark = pytest.mark.usefixtures("quiet_single_threaded")`."""
    import torch

    for key, value in QUIET_ENV.items():
        monkeypatch.setenv(key, value)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_overrides(data_dir: Path, *extra: str) -> list[str]:
    """A 2-layer, 32-wide GPT-2, a few steps with gradient accumulation, few eval windows."""
    return [
        "model=gpt2_nano",
        f"data.dir={data_dir}",
        "device=cpu",
        "train.max_steps=12",
        "train.warmup_steps=2",
        "train.batch_size=4",
        "train.micro_batch_size=2",
        "train.log_interval=2",
        "train.eval_interval=4",
        "train.eval_windows=8",
        "train.checkpoint_interval=4",
        "eval.max_windows=64",
        "prune.sparsities=[0.0,0.5,0.9]",
        *extra,
    ]


def compose_cfg(overrides: list[str]):
    """train_gpt2's config with `overrides` (unresolved), as the entry point gets it."""
    from horst_sparse.compose import compose
    from horst_sparse.pipeline import get

    return compose(get("gpt2"), overrides)


# ---- the ViT pipeline on CPU: a tiny ImageNet-layout folder, the DeiT recipe under AC/DC -----------
CLASSES = ("n01440764", "n01443537", "n01484850")


@pytest.fixture(scope="module")
def quiet_env():
    """Module-wide (the shared reference run too): offline, plain optimizer path, and one
    thread, so that every run in the module uses the same kernels (and tiny matrices run
    fastest). The modules that want it say `pytestmark = pytest.mark.usefixtures("quiet_env")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in QUIET_ENV.items():
            patch.setenv(key, value)
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def imagenet_root(tmp_path_factory) -> Path:
    """ImageNet layout: train/<wnid>/*.png (10 per class: 2 go to the minival, 8 train),
    val/<wnid>/*.png (4 per class); each class a colour, with noise."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("imagenet")
    rng = np.random.default_rng(0)
    for label, wnid in enumerate(CLASSES):
        for split, count in (("train", 10), ("val", 4)):
            folder = root / split / wnid
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 80, (20, 20, 3))
                pixels[..., label] += 170
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{wnid}_{i}.png")
    return root


def _compose(overrides: list[str]):
    """train_vit's config with `overrides` (unresolved), as the entry point gets it."""
    from horst_sparse.compose import compose
    from horst_sparse.pipeline import get

    return compose(get("vit"), overrides)


# dense 0; compressed 1-2; decompressed 3; compressed 4-5.
SHORT_ACDC = [
    "acdc.dense_warmup=1",
    "acdc.compressed=2",
    "acdc.decompressed=1",
    "acdc.final_decompressed=1",
    "acdc.final_compressed=2",
    "train.epochs=6",
]


def deit_overrides(root: Path, *extra: str) -> list[str]:
    """The DeiT recipe (RandAugment, random erasing, Mixup/CutMix, drop path, warm-up + cosine)
    on a 16x16 ViT and the tiny folder: 3 updates of 8 images per epoch."""
    return [
        "vit_recipe=deit_imagenet",
        "model=vit_nano",
        f"data.root={root}",
        "data.minival_size=6",
        "data.num_workers=1",
        "device=cpu",
        "cpu_threads=1",  # the reproducible CPU mode's fixed thread count (the recipe, a GPU one, keeps torch's)
        "compile=false",  # the recipe compiles for a GPU; on these tiny CPU runs compiling would take most of the time
        "train.batch_size=8",
        "train.base_batch_size=8",
        "train.warmup_epochs=1",
        "train.eval_batch_size=8",
        "train.log_interval=2",
        "acdc.sparsity=0.8",
        *SHORT_ACDC,
        *extra,
    ]


# ---- the real SLURM cluster of scripts/slurm_cluster.sh (tests/test_slurm_*.py) ---------------
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


# A study's tidy frame for the analysis tests (test_study_report.py, test_claims_rules.py).
def record(
    values: dict[tuple[str, str, float], list[float]], *, pipeline: str = "vit", split: str = "test"
) -> pd.DataFrame:
    """A study's tidy frame: {(arm, metric, sparsity): per-seed values} (GPT-2's 0 % is the dense model)."""
    rows = []
    for (arm, metric, sparsity), per_seed in values.items():
        method, pattern = (
            ("acdc", "unstructured")
            if pipeline == "vit"
            else (("none", "dense") if sparsity == 0 else ("magnitude", "unstructured"))
        )
        for seed, value in enumerate(per_seed):
            rows.append(
                {
                    "run": f"{pipeline}/{arm}/s{sparsity}/seed{seed}",
                    "pipeline": pipeline,
                    "data": "d",
                    "model": "m",
                    "arm": arm,
                    "optimizer": arm.split("_")[0],
                    "seed": seed,
                    "eval_split": split,
                    "git_commit": "c" * 40,
                    "signature": arm,
                    "metric": metric,
                    "method": method,
                    "pattern": pattern,
                    "sparsity": sparsity,
                    "value": value,
                    "wall_time_s": 1.0,
                }
            )
    return pd.DataFrame(rows)


def vit_claim(gains: dict[float, float], noise: float = 0.1, seeds: int = 10) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    values = {}
    for sparsity, gain in gains.items():
        base = 90 - 10 * sparsity + rng.normal(0, 1, seeds)  # the seed-to-seed spread cancels in the pairs
        values[("adamw", "top1", sparsity)] = list(base)
        values[("horst", "top1", sparsity)] = list(base + gain + rng.normal(0, noise, seeds))
    return record(values)
