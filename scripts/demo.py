"""The embedded reproduction (`make demo`): both pipelines' embedded defaults with AdamW, HAM
and HORST, then the paper's tables and figures from them.

    python scripts/demo.py                       # runs into outputs/demo/, results into results/demo/

Six runs, one after the other, each a plain subprocess whose output streams to the terminal
(and into `outputs/demo/<run>.log`):

    python train_vit.py  optimizer={adamw,ham,horst} hydra.run.dir=outputs/demo/vit_<opt>  [DEMO_OVERRIDES]
    python train_gpt2.py optimizer={adamw,ham,horst} hydra.run.dir=outputs/demo/gpt2_<opt> [DEMO_OVERRIDES]

then `python scripts/make_tables.py outputs/demo --out results/demo`, and
`results/demo/README.md`: the commands, the commit, the date, the machine, each run's wall
time, the tables, and what they do and do not show. Earlier demo runs in `outputs/demo/` are
deleted first (a demo never mixes runs of two commits). A run that fails stops the demo with
its name and log.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPTIMIZERS = ("adamw", "ham", "horst")
PIPELINES = {"vit": "train_vit.py", "gpt2": "train_gpt2.py"}
# Overrides of the embedded defaults (configs/train_*.yaml; ViT: AC/DC at 90 %, GPT-2:
# one-shot pruning at 0, 50, ..., 90 %), recorded in the README: half the GPT-2 batch and the
# first 64 validation windows (the same tokens for every optimizer and sparsity) keep the
# demo well inside 15 minutes on 2 cores; the measured wall times are in results/demo/README.md.
DEMO_OVERRIDES: dict[str, list[str]] = {
    "vit": [],
    "gpt2": ["train.batch_size=4", "train.micro_batch_size=4", "eval.max_windows=64"],
}
IDLE_ESTIMATE = "about 45 s per ViT run and 80 s per GPT-2 run, 6.5 min in all, as measured at commit ec3be05"
ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}
ENVIRONMENT_DEFAULTS = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    # OpenMP threads that spin-wait cost a lot when the cores are shared.
    "OMP_WAIT_POLICY": "PASSIVE",
}


@dataclass(frozen=True)
class DemoRun:
    name: str  # e.g. gpt2_horst
    pipeline: str
    optimizer: str
    argv: tuple[str, ...]
    run_dir: Path
    log: Path

    @property
    def command(self) -> str:
        """The command line as a user would type it (relative to the repository)."""
        return shlex.join(["python", *self.argv[1:]])


class RunFailed(RuntimeError):
    pass


def plan(runs_dir: Path, *, python: str = sys.executable) -> list[DemoRun]:
    """The six runs: ViT first (shorter), then GPT-2, each with AdamW, HAM, HORST."""
    runs = []
    for pipeline, script in PIPELINES.items():
        for optimizer in OPTIMIZERS:
            name = f"{pipeline}_{optimizer}"
            run_dir = runs_dir / name
            argv = (python, script, f"optimizer={optimizer}", f"hydra.run.dir={_shown(run_dir)}", *DEMO_OVERRIDES[pipeline])
            runs.append(DemoRun(name, pipeline, optimizer, argv, run_dir, runs_dir / f"{name}.log"))
    return runs


def _shown(path: Path) -> str:
    """`path` relative to the repository when it is inside it (shorter, machine-independent)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def environment() -> dict[str, str]:
    env = {**ENVIRONMENT_DEFAULTS, **os.environ, **ENVIRONMENT}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def execute(run: DemoRun, *, env: dict[str, str] | None = None) -> float:
    """Run one command from the repository root, streaming its output to the terminal and to
    `run.log`; return its wall time. A non-zero exit raises RunFailed naming the run and log."""
    run.log.parent.mkdir(parents=True, exist_ok=True)
    print(f"\n=== {run.name}: {run.command}", flush=True)
    started = time.monotonic()
    with open(run.log, "wb") as log:
        process = subprocess.Popen(run.argv, cwd=REPO, env=env or environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            # Raw chunks, not lines: tqdm redraws its bar with carriage returns.
            while chunk := process.stdout.read1(65536):
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                log.write(chunk)
        except KeyboardInterrupt:
            process.terminate()
            process.wait()
            raise
        returncode = process.wait()
    seconds = time.monotonic() - started
    if returncode != 0:
        raise RunFailed(
            f"demo run {run.name} failed (exit code {returncode}) after {seconds:.0f} s: {run.command}\n"
            f"its output is in {run.log}; the run folder is {run.run_dir}"
        )
    if not (run.run_dir / "summary.json").is_file():
        raise RunFailed(f"demo run {run.name} exited 0 but wrote no {run.run_dir / 'summary.json'}; see {run.log}")
    print(f"=== {run.name}: done in {seconds:.0f} s", flush=True)
    return seconds


def git_commit() -> tuple[str, list[str]]:
    """Short commit of the code, with `-dirty` when files other than the demo's own outputs
    (results/demo/) differ from it, and the list of those files."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "--short", "HEAD").strip()
        changed = [line[3:] for line in git("status", "--porcelain", "--", ".", ":(exclude)results/demo").splitlines()]
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)", []
    return commit + ("-dirty" if changed else ""), changed


def machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    import torch

    return (
        f"{platform.system()} {platform.machine()}, {cores} CPU cores available to the demo "
        f"({os.cpu_count()} on the machine), {_cpu_model()}; Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _load() -> str:
    return "n/a" if not hasattr(os, "getloadavg") else ", ".join(f"{x:.1f}" for x in os.getloadavg())


def scale(summaries: dict[str, dict]) -> str:
    """The runs' size in words, from their summary.json files."""
    parts = []
    vit = next((s for name, s in summaries.items() if name.startswith("vit")), None)
    if vit:
        m, d, t = vit["model"], vit["data"], vit["train"]
        parts.append(
            f"a {m['depth']}-block, {m['embed_dim']}-wide ViT ({m['parameters'] / 1e6:.2f}M parameters) on "
            f"scikit-learn's 8x8 digits ({d['train_images']} training / {d['val_images']} validation images), "
            f"{t['epochs']} epochs with AC/DC at {vit['target_sparsity']:.0%} sparsity, instead of DeiT on ImageNet"
        )
    gpt2 = next((s for name, s in summaries.items() if name.startswith("gpt2")), None)
    if gpt2:
        m, d, t = gpt2["model"], gpt2["data"], gpt2["train"]
        parts.append(
            f"a {m['n_layer']}-layer, {m['n_embd']}-wide GPT-2 ({m['parameters'] / 1e6:.1f}M parameters, most of "
            f"them the token embedding) trained for {t['steps']} steps of {t['batch_size']} x {t['context']} tokens "
            f"({t['tokens_trained']:,} tokens) on CPython's pydoc text ({d['train_tokens']:,} distinct training "
            f"tokens), perplexity on {gpt2['pruning']['tokens']:,} validation tokens, instead of GPT-2 Small on "
            "SlimPajama-6B"
        )
    return "; and ".join(parts)


def readme(
    *, command: str, commit: str, changed: list[str], started: datetime.datetime, runs: list[DemoRun], seconds: dict[str, float],
    summaries: dict[str, dict], total_s: float, tables_cmd: str, tables_md: str, load_before: str, load_after: str,
) -> str:  # fmt: skip
    overrides = "; ".join(f"{p}: `{' '.join(o)}`" for p, o in DEMO_OVERRIDES.items() if o) or "none"
    uncommitted = f" (uncommitted changes then: {', '.join(changed)})" if changed else ""
    run_lines = "\n".join(f"| {r.name} | `{r.command}` | {seconds[r.name]:.0f} |" for r in runs)
    seeds = sorted({str(s.get("seed")) for s in summaries.values()})
    return f"""# The embedded reproduction (`make demo`)

Produced by `{command}` (what `make demo` runs) at commit `{commit}`{uncommitted} on
{started:%Y-%m-%d %H:%M} UTC.
Machine: {machine()}. Load average (1, 5, 15 min) before the demo {load_before}, after it
{load_after}: a load above the core count means other processes shared the cores, and the
wall times below are inflated accordingly (on 2 idle cores: {IDLE_ESTIMATE}).
Total wall time {total_s / 60:.1f} min. Overrides of the embedded defaults (to stay within
15 min on 2 cores; see scripts/demo.py): {overrides}.

| run | command | wall time (s) |
|---|---|---:|
{run_lines}

Then: `{tables_cmd}` (tables and figures in this folder; run folders, logs and checkpoints
stay in the git-ignored `outputs/demo/`).

## What these numbers show, and what they do not

* They show that both pipelines run end to end with AdamW, HAM and HORST, and the outcome
  of one small experiment each, in the shape of the paper's two tables: the DeiT AC/DC
  table (top-1 of the final sparse model) and the GPT-2 table (validation perplexity after
  one-shot layerwise magnitude pruning), plus the weight-magnitude distributions.
* Small models on small data, not the paper's scale: {scale(summaries)}.
* One seed per cell (seed {", ".join(seeds)}). On the digits, the seed-to-seed spread of
  the final sparse accuracy is about 1-2.5 points (4 seeds in an early calibration on this machine), so differences of
  that size between optimizers here are not evidence either way; the GPT-2 perplexities
  come from one training run per optimizer and are not tested for significance either.
* HORST's and HAM's alpha and beta are the pipelines' defaults (configs/optimizer/,
  configs/tuning/), chosen on these embedded benchmarks; the paper's values are unknown.
* The paper's numbers (results/paper/) are for DeiT on ImageNet; none applies to these
  runs, so the tables have no paper column. "Against the paper's claims" below compares
  our means in the direction the paper claims, nothing more.

## Results

{tables_md}"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", default=str(REPO / "outputs" / "demo"), help="run folders (deleted first)")
    parser.add_argument("--out", default=str(REPO / "results" / "demo"), help="tables, figures and README.md")
    args = parser.parse_args(argv)
    runs_dir, out = Path(args.runs_dir), Path(args.out)

    command = shlex.join(["python", _shown(Path(__file__)), *(argv if argv is not None else sys.argv[1:])])
    (commit, changed), started, load_before = git_commit(), datetime.datetime.now(datetime.timezone.utc), _load()
    runs = plan(runs_dir)
    if runs_dir.exists():
        shutil.rmtree(runs_dir)
    clock, seconds = time.monotonic(), {}
    try:
        for run in runs:
            seconds[run.name] = execute(run)
    except RunFailed as error:
        sys.exit(f"\nerror: {error}\nthe demo stopped; results in {_shown(out)} were not updated")

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_tables

    tables_cmd = shlex.join(["python", "scripts/make_tables.py", _shown(runs_dir), "--out", _shown(out)])
    print(f"\n=== tables: {tables_cmd}", flush=True)
    if out.exists():
        shutil.rmtree(out)
    try:
        tables_md = make_tables.make_tables([runs_dir], out)
    except make_tables.NoRunsError as error:
        sys.exit(f"error: {error}")
    total_s = time.monotonic() - clock
    summaries = {run.name: json.loads((run.run_dir / "summary.json").read_text()) for run in runs}
    (out / "README.md").write_text(
        readme(
            command=command, commit=commit, changed=changed, started=started, runs=runs, seconds=seconds, summaries=summaries,
            total_s=total_s, tables_cmd=tables_cmd, tables_md=tables_md, load_before=load_before, load_after=_load(),
        )
    )  # fmt: skip
    print(tables_md.split("\n### Files")[0])
    print(f"demo done in {total_s / 60:.1f} min: {_shown(out)}/ (README.md, tables, figures)")


if __name__ == "__main__":
    main()
