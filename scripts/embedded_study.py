"""The embedded study, and the demo: both embedded benchmarks x optimizers x seeds as Hydra
multiruns, then tables, paired statistics over seeds, figures and the paper's claims judged
at this scale (scripts/study_report.py over scripts/make_tables.py).

    python scripts/embedded_study.py              # the study: 5 seeds, 4 optimizers, 2 ablations (~1.5 h on 2 cores)
    python scripts/embedded_study.py --demo       # make demo: 1 seed, AdamW/HAM/HORST, no ablations (~12 min)
    python scripts/embedded_study.py --report-only   # tables from the runs already in --runs-dir
    python scripts/embedded_study.py --check      # make check-results: rerun one committed cell per pipeline

The cells (docs/design.md §5):

* ViT on the 8x8 digits under AC/DC at each of `--sparsities` (0.8, 0.9, 0.95, 0.98, 0.99, 0.995: up
  to 0.98 the digits still saturate, so the curve goes on until the optimizers part);
* GPT-2 tiny on pydoc text over its compact vocabulary, pruned one-shot by magnitude and by
  Wanda, unstructured at 0-90 % and 2:4;
* optimizers (`--optimizers`): adamw, ham, horst (order "ms", the paper's), horst_sm (order
  "sm", S∘M on the gradient: the paper's ablation), with the pipelines' tuned alpha/beta;
* ablations: the ViT's `acdc.reset_second_moment=true` (HORST at 90 %), GPT-2's
  `optimizer.hyperbolic_params=prunable` (HORST; the default all_2d also mirrors the tied token
  embedding), and a control for both pipelines, `adamw_decay`: AdamW whose weight decay is
  HORST's weight decay + beta, i.e. as much shrinkage per step as HORST (ViT at 90 and 99.5 %).

Each (pipeline, variant, sparsity) is one Hydra multirun over the seeds, into
`<runs-dir>/<pipeline>/<variant>[/s<sparsity>]/seed<k>`; `--jobs` of them run side by side,
each run on one thread (one process per core beats two threads per process at these
sizes). Resumable: a seed whose folder holds `summary.json` is not run again, an unfinished
one continues from its checkpoint (`resume: auto`), a failed one (`failed.json`) is
reported, not retried (delete its folder to retry). One progress line per finished run.
A finished run whose `config.yaml` differs from the config this code composes for its cell
(a recipe or a tuned value changed since it ran) stops the study before anything runs, named
with the differing keys: delete it to rerun it. The report covers the planned multiruns'
folders only, so runs of another plan left in `--runs-dir` stay out of it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

SCRIPTS = {"vit": "train_vit.py", "gpt2": "train_gpt2.py"}
VARIANTS = {  # the optimizers compared
    "adamw": ("optimizer=adamw",),
    "ham": ("optimizer=ham",),
    "horst": ("optimizer=horst",),
    "horst_sm": ("optimizer=horst", "optimizer.order=sm"),
}
# (pipeline, variant): overrides, ViT sparsities ((None,) for GPT-2). What each is compared with:
# study_report.ABLATIONS.
ABLATIONS = {
    ("vit", "horst_reset"): (("optimizer=horst", "acdc.reset_second_moment=true"), (0.9,)),
    ("gpt2", "horst_prunable"): (("optimizer=horst", "optimizer.hyperbolic_params=prunable"), (None,)),
    # AdamW that decays as hard as HORST: HORST shrinks a mirrored weight by (1 - lr wd) exp(-lr beta),
    # about 1 - lr (wd + beta), per step; AdamW by 1 - lr wd. Is HORST's gain its mirror step, or
    # only more decay? The value is wd + beta of the pipeline's HORST (tests/test_embedded_study.py).
    ("vit", "adamw_decay"): (("optimizer=adamw", "optimizer.weight_decay=0.35"), (0.9, 0.995)),
    ("gpt2", "adamw_decay"): (("optimizer=adamw", "optimizer.weight_decay=1.1"), (None,)),
}
SETTINGS = {  # every run of a pipeline, beside the embedded default
    "vit": ("logging.mode=disabled",),
    "gpt2": ("prune.methods=[magnitude,wanda]", 'prune.patterns=[unstructured,"2:4"]', "logging.mode=disabled"),
}
STUDY = {"seeds": 5, "optimizers": list(VARIANTS), "sparsities": [0.8, 0.9, 0.95, 0.98, 0.99, 0.995], "ablations": True,
         "runs_dir": "outputs/embedded", "out": "results/embedded"}  # fmt: skip
DEMO = {"seeds": 1, "optimizers": ["adamw", "ham", "horst"], "sparsities": [0.8, 0.9, 0.95, 0.98, 0.99, 0.995], "ablations": False,
        "runs_dir": "outputs/demo", "out": "results/demo"}  # fmt: skip
# `--check` reruns seed 0 of these cells and compares with runs.csv in --out. Same machine and
# thread count: identical (summation order is fixed). Elsewhere: within these tolerances, far
# below the seed-to-seed spread (ViT ~1 point, GPT-2 a few %): 2 of the 360 validation
# images, 1 % of a perplexity.
CHECKED = (("vit", "horst", 0.9), ("gpt2", "horst", None))
TOLERANCE = {"top1": ("absolute", 2 / 360), "ppl_dense": ("relative", 0.01), "ppl_0.9": ("relative", 0.01)}
METRICS = {"vit": ("top1",), "gpt2": ("ppl_dense", "ppl_0.9")}
ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
ENVIRONMENT_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}  # spinning OpenMP threads cost a lot on shared cores


@dataclass(frozen=True)
class Group:
    """One multirun: a pipeline, a variant (optimizer or ablation) and for the ViT a sparsity, over seeds."""

    pipeline: str
    variant: str
    overrides: tuple[str, ...]
    sparsity: float | None = None

    @property
    def name(self) -> str:
        return f"{self.pipeline}/{self.variant}" + (f"/s{self.sparsity:g}" if self.sparsity is not None else "")

    def folder(self, runs_dir: Path) -> Path:
        return runs_dir / self.name

    def arguments(self, runs_dir: Path, seeds: list[int]) -> list[str]:
        """The multirun's command-line overrides."""
        sparsity = () if self.sparsity is None else (f"acdc.sparsity={self.sparsity:g}",)
        return [
            *self.overrides, *sparsity, *SETTINGS[self.pipeline], "cpu_threads=1", f"seed={','.join(map(str, seeds))}",
            f"hydra.sweep.dir={_shown(self.folder(runs_dir))}", "hydra.sweep.subdir=seed${seed}",
        ]  # fmt: skip

    def command(self, runs_dir: Path, seeds: list[int], *, python: str = "python") -> list[str]:
        return [python, SCRIPTS[self.pipeline], "-m", *self.arguments(runs_dir, seeds)]


def plan(optimizers: list[str], sparsities: list[float], *, ablations: bool) -> list[Group]:
    """GPT-2's groups first (the longer runs, so the pool ends on short ones), then the ViT's by
    sparsity; each pipeline's ablations after its optimizers."""
    extra = [Group(p, v, o, s) for (p, v), (o, ss) in ABLATIONS.items() for s in ss] if ablations else []
    groups = [Group("gpt2", v, VARIANTS[v]) for v in optimizers] + [g for g in extra if g.pipeline == "gpt2"]
    groups += [Group("vit", v, VARIANTS[v], s) for s in sparsities for v in optimizers]
    return groups + [g for g in extra if g.pipeline == "vit"]


def seed_state(folder: Path) -> str:
    """finished | failed | unfinished | new."""
    if (folder / "summary.json").is_file():
        return "finished"
    if (folder / "failed.json").is_file():
        return "failed"
    return "unfinished" if folder.exists() else "new"


def stale_runs(groups: list[Group], seeds: list[int], runs_dir: Path) -> list[str]:
    """`folder: key: old -> new; ...` for every finished run whose `config.yaml` differs from the
    config this code composes for its cell (a recipe, a tuned alpha/beta or a default changed
    since it ran): a resumed study would otherwise report its numbers as this code's. Keys
    that do not change a run's numbers (`training.runner.RESUMABLE_CHANGES`) are not compared."""
    import yaml
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    import plan
    from training.runner import RESUMABLE_CHANGES, config_differences

    entries: dict[str, plan.Entry] = {}
    stale = []
    for group in groups:
        finished = [s for s in seeds if seed_state(group.folder(runs_dir) / f"seed{s}") == "finished"]
        if not finished:
            continue
        if group.pipeline not in entries:  # imports the entry point, which registers its config schemas
            entries[group.pipeline] = plan.load_entry(REPO / SCRIPTS[group.pipeline])
        _, cells = plan.expand(entries[group.pipeline], group.arguments(runs_dir, finished))
        for cell in cells:
            HydraConfig.instance().set_config(cell.config)  # for ${hydra:...} in the job's keys
            job = cell.config.copy()
            with open_dict(job):
                del job["hydra"]
            composed = OmegaConf.to_container(job, resolve=True)
            folder = group.folder(runs_dir) / f"seed{composed['seed']}"
            recorded = yaml.safe_load((folder / "config.yaml").read_text()) if (folder / "config.yaml").is_file() else {}
            differences = config_differences(recorded, composed, ignore=RESUMABLE_CHANGES)
            if differences:
                stale.append(f"{_shown(folder)}: {'; '.join(differences)}")
    return stale


def headline(summary: dict) -> str:
    """The number a run is read for: the ViT's final top-1, GPT-2's dense and 90 % perplexity."""
    if summary.get("pipeline") == "vit":
        return f"top-1 {100 * summary['top1']:.2f} %"
    ppl = summary.get("ppl", {})
    return f"perplexity {ppl.get('0', float('nan')):.2f} dense, {ppl.get('0.9', float('nan')):.2f} at 90 %"


class Progress:
    """Prints one line per run that finishes or fails below `runs_dir` (polled from a thread)."""

    def __init__(self, runs: list[Path], started: float) -> None:
        self.runs, self.started, self.seen = runs, started, set()
        self.stop = threading.Event()

    def poll(self) -> None:
        for run in self.runs:
            state = seed_state(run)
            if run in self.seen or state not in ("finished", "failed"):
                continue
            self.seen.add(run)
            if state == "finished":
                summary = json.loads((run / "summary.json").read_text())
                what = f"{headline(summary)} ({summary.get('wall_time_s', float('nan')):.0f} s)"
            else:
                what = f"FAILED: {json.loads((run / 'failed.json').read_text()).get('reason', '?')}"
            elapsed = (time.monotonic() - self.started) / 60
            print(f"[{len(self.seen)}/{len(self.runs)}, {elapsed:.1f} min] {_shown(run)}: {what}", flush=True)

    def watch(self) -> None:
        while not self.stop.wait(2.0):
            self.poll()


def run_group(group: Group, seeds: list[int], runs_dir: Path, logs: Path) -> tuple[Group, int, float]:
    """The group's multirun, its output into `logs/<name>.log`; (group, exit status, seconds)."""
    log = logs / (group.name.replace("/", "_") + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    env = {**ENVIRONMENT_DEFAULTS, **os.environ, **ENVIRONMENT}
    with open(log, "ab") as out:
        returncode = subprocess.call(group.command(runs_dir, seeds, python=sys.executable), cwd=REPO, env=env,
                                     stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    return group, returncode, time.monotonic() - started


def run_all(groups: list[Group], seeds: list[int], runs_dir: Path, *, jobs: int) -> None:
    """Run every group's missing seeds, `jobs` multiruns at a time."""
    todo = {g: [s for s in seeds if seed_state(g.folder(runs_dir) / f"seed{s}") in ("new", "unfinished")] for g in groups}
    todo = {g: s for g, s in todo.items() if s}
    runs = [g.folder(runs_dir) / f"seed{s}" for g, ss in todo.items() for s in ss]
    planned = len(groups) * len(seeds)
    print(f"{len(runs)} of {planned} runs to do, in {len(todo)} multiruns, {jobs} at a time", flush=True)
    progress = Progress(runs, time.monotonic())
    watcher = threading.Thread(target=progress.watch, daemon=True)
    watcher.start()
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for group, returncode, _ in pool.map(lambda g: run_group(g, todo[g], runs_dir, runs_dir / "logs"), todo):
                if returncode:  # the failed cells are listed by the report; the others go on
                    print(f"{group.name}: exit status {returncode}, see {_shown(runs_dir / 'logs')}", flush=True)
    finally:
        progress.stop.set()
        watcher.join()
        progress.poll()


def runs_table(groups: list[Group], seeds: list[int], runs_dir: Path) -> pd.DataFrame:
    """One line per planned run: its cell, state, headline numbers, threads and commit (runs.csv)."""
    rows = []
    for group in groups:
        for seed in seeds:
            folder = group.folder(runs_dir) / f"seed{seed}"
            row = {"pipeline": group.pipeline, "variant": group.variant, "sparsity": group.sparsity, "seed": seed,
                   "state": seed_state(folder), "folder": _shown(folder)}  # fmt: skip
            if row["state"] == "finished":
                s = json.loads((folder / "summary.json").read_text())
                env = s.get("environment", {})
                row |= {"top1": s.get("top1"), "ppl_dense": s.get("ppl", {}).get("0"), "ppl_0.9": s.get("ppl", {}).get("0.9"),
                        "wall_time_s": s.get("wall_time_s"), "threads": env.get("cpu_threads"),
                        "commit": s.get("git_commit")}  # fmt: skip
            rows.append(row)
    return pd.DataFrame(rows)


def scale(runs_dir: Path) -> str:
    """The benchmarks' size in words, from one finished run of each."""
    parts = []
    vit = next(runs_dir.glob("vit/*/*/seed*/summary.json"), None)
    if vit:
        s = json.loads(vit.read_text())
        m, d, t = s["model"], s["data"], s["train"]
        parts.append(
            f"a {m['depth']}-block, {m['embed_dim']}-wide ViT ({m['parameters'] / 1e6:.2f}M parameters) on scikit-learn's "
            f"8x8 digits ({d['train_images']} training / {d['val_images']} validation images), {t['epochs']} epochs under "
            "AC/DC, instead of DeiT on ImageNet"
        )
    gpt2 = next(runs_dir.glob("gpt2/*/seed*/summary.json"), None)
    if gpt2:
        s = json.loads(gpt2.read_text())
        m, d, t = s["model"], s["data"], s["train"]
        parts.append(
            f"a {m['n_layer']}-layer, {m['n_embd']}-wide GPT-2 ({m['parameters'] / 1e6:.1f}M parameters) over the "
            f"{d.get('vocab_size', 50257):,}-token vocabulary of CPython's pydoc text, {t['steps']} steps of "
            f"{t['batch_size']} x {t['context']} tokens ({t['tokens_trained']:,} tokens; {d['train_tokens']:,} training "
            f"tokens), perplexity on {s['pruning']['tokens']:,} validation tokens, instead of GPT-2 Small on SlimPajama-6B"
        )
    return "; and ".join(parts)


def check_results(out: Path, scratch: Path) -> int:
    """Rerun seed 0 of each CHECKED cell into `scratch` and compare it with `out/runs.csv`;
    0 when every number is within its tolerance."""
    committed = pd.read_csv(out / "runs.csv")
    worst = 0
    for pipeline, variant, sparsity in CHECKED:
        group = Group(pipeline, variant, VARIANTS[variant], sparsity)
        rows = committed[(committed.pipeline == pipeline) & (committed.variant == variant) & (committed.seed == 0)
                         & (committed.sparsity.isna() if sparsity is None else committed.sparsity == sparsity)]  # fmt: skip
        if rows.empty or rows.iloc[0].state != "finished":
            print(f"{group.name} seed 0: not in {_shown(out / 'runs.csv')} as a finished run; nothing to compare")
            worst = 1
            continue
        row = rows.iloc[0]
        print(f"{group.name} seed 0: rerunning `{shlex.join(group.command(scratch, [0]))}` ...", flush=True)
        _, returncode, seconds = run_group(group, [0], scratch, scratch / "logs")
        summary_path = group.folder(scratch) / "seed0" / "summary.json"
        if returncode or not summary_path.is_file():
            print(f"{group.name} seed 0: the rerun failed (exit status {returncode}); see {scratch / 'logs'}")
            worst = 1
            continue
        rerun = runs_table([group], [0], scratch).iloc[0]
        for metric in METRICS[pipeline]:
            kind, tolerance = TOLERANCE[metric]
            before, after = float(row[metric]), float(rerun[metric])
            if not (math.isfinite(before) and math.isfinite(after)):
                print(f"  {metric}: committed {before}, rerun {after}: not comparable")
                worst = 1
                continue
            off = abs(after - before) / (abs(before) if kind == "relative" else 1.0)
            verdict = "identical" if after == before else "within tolerance" if off <= tolerance else "OUT OF TOLERANCE"
            worst = max(worst, int(off > tolerance))
            print(f"  {metric}: committed {before:.6g} (commit {row.commit}, {row.threads:g} thread), rerun {after:.6g} "
                  f"({rerun.threads:g} thread, {seconds:.0f} s): {verdict} ({kind} tolerance {tolerance:.4g})")  # fmt: skip
    return worst


def _shown(path: Path) -> str:
    """`path` relative to the repository when it is inside it (shorter, machine-independent)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def git_commit() -> str:
    """Short commit of the code, `-dirty` when files outside results/ differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "--short", "HEAD").strip()
        changed = git("status", "--porcelain", "--", ".", ":(exclude)results").strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return commit + ("-dirty" if changed else "")


def machine() -> str:
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")  # fmt: skip
    return (f"{platform.system()} {platform.machine()}, {cores} CPU cores available ({os.cpu_count()} on the machine), "
            f"{model}; Python {platform.python_version()}, torch {torch.__version__}")  # fmt: skip


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def readme(*, command: str, commit: str, started: datetime.datetime, total_s: float, jobs: int, groups: list[Group],
           seeds: list[int], runs_dir: Path, runs: pd.DataFrame, loads: tuple[str, str], report_md: str) -> str:  # fmt: skip
    """The folder's README: how these numbers were made, then the report."""
    names = runs.pipeline + "/" + runs.variant + runs.sparsity.map(lambda s: "" if pd.isna(s) else f"/s{s:g}")
    seconds = runs.groupby(names).wall_time_s.sum()
    lines = "\n".join(f"| {g.name} | `{shlex.join(g.command(runs_dir, seeds))}` | {seconds.get(g.name, 0):.0f} |" for g in groups)
    commits = ", ".join(f"`{c[:7]}{'-dirty' if c.endswith('-dirty') else ''}`" for c in sorted(runs.commit.dropna().unique()))
    return f"""# The embedded study

Produced by `{command}` at commit `{commit}`, started {started:%Y-%m-%d %H:%M} UTC, {total_s / 60:.1f} min
(a resumed study runs only what is missing: the runs themselves record commit(s) {commits}, and
took {runs.wall_time_s.sum() / 60:.0f} min of single-thread run time in all).
Machine: {machine()}; {jobs} multiruns side by side, every run on 1 torch thread. Load
average (1, 5, 15 min) before {loads[0]}, after {loads[1]}.

Determinism: on the same machine with the same thread count a cell reruns to the same
numbers (`make check-results`, i.e. `python scripts/embedded_study.py --check`, reruns seed 0
of the HORST cells of both pipelines and compares with `runs.csv`); on another machine or
thread count the floating-point summation order differs, and a cell should agree within the
tolerance `--check` states (2 of the 360 validation images; 1 % of a perplexity), not exactly.

Small models on small data, not the paper's scale: {scale(runs_dir)}. The optimizers'
alpha/beta are the pipelines' picks on these benchmarks (configs/tuning/, results/tuning/);
the paper's are unknown.

Every run: `<multirun command>` below with `seed=<k>`; its folder is
`{_shown(runs_dir)}/<multirun>/seed<k>` (git-ignored; `runs.csv` here lists them with their
numbers, thread count and commit). Times are the sum of the multirun's runs' wall times.

| multirun | command | run time (s) |
|---|---|---:|
{lines}

{report_md}"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", action="store_true", help="the demo's size: " + json.dumps(DEMO))
    parser.add_argument("--seeds", type=int, help=f"seeds 0..N-1 (default {STUDY['seeds']})")
    parser.add_argument("--optimizers", nargs="+", choices=list(VARIANTS), help=f"default: {' '.join(STUDY['optimizers'])}")
    parser.add_argument("--sparsities", nargs="+", type=float, help="ViT AC/DC target sparsities (default 0.8 0.9 0.95 0.98 0.99 0.995)")
    parser.add_argument("--no-ablations", dest="ablations", action="store_false", default=None, help="skip the two ablations")
    parser.add_argument("--runs-dir", help="run folders (default outputs/embedded; --demo: outputs/demo)")
    parser.add_argument("--out", help="tables, figures, README.md (default results/embedded; --demo: results/demo)")
    parser.add_argument("--jobs", type=int, default=2, help="multiruns side by side, one thread each (default 2)")
    parser.add_argument("--report-only", action="store_true", help="no runs: the report of the runs already there")
    parser.add_argument("--check", action="store_true", help="rerun seed 0 of one cell per pipeline, compare with --out/runs.csv")
    args = parser.parse_args(argv)
    size = {**(DEMO if args.demo else STUDY), **{k: v for k, v in vars(args).items() if k in STUDY and v is not None}}
    seeds, runs_dir, out = list(range(size["seeds"])), REPO / size["runs_dir"], REPO / size["out"]
    groups = plan(size["optimizers"], size["sparsities"], ablations=size["ablations"])
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: use 1 or more")
    if args.check:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="check-results-") as scratch:
            return check_results(out, Path(scratch))

    stale = stale_runs(groups, seeds, runs_dir)
    if stale:
        print(f"error: {len(stale)} finished run(s) in {_shown(runs_dir)} were made with other settings than this code "
              "composes for their cell; their numbers are not this code's. Delete them to rerun them (or pass another "
              "--runs-dir):\n" + "\n".join(f"  {line}" for line in stale), file=sys.stderr)  # fmt: skip
        return 2
    command = shlex.join(["python", "scripts/embedded_study.py", *(sys.argv[1:] if argv is None else argv)])
    commit, started, load_before, clock = git_commit(), datetime.datetime.now(datetime.timezone.utc), load(), time.monotonic()
    if not args.report_only:
        run_all(groups, seeds, runs_dir, jobs=args.jobs)

    import study_report

    out.mkdir(parents=True, exist_ok=True)
    runs = runs_table(groups, seeds, runs_dir)
    runs.to_csv(out / "runs.csv", index=False)
    report_md = study_report.write_report(runs_dir, out, folders=[g.folder(runs_dir) for g in groups])
    (out / "README.md").write_text(readme(
        command=command, commit=commit, started=started, total_s=time.monotonic() - clock, jobs=args.jobs, groups=groups,
        seeds=seeds, runs_dir=runs_dir, runs=runs, loads=(load_before, load()), report_md=report_md,
    ))  # fmt: skip
    missing = runs[runs.state != "finished"]
    print(f"report: {_shown(out)}/README.md ({len(runs) - len(missing)} of {len(runs)} runs finished)")
    if len(missing):
        print("not finished:\n" + "\n".join(f"  {f} ({s})" for f, s in zip(missing.folder, missing.state)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
