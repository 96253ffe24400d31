"""Run records: `metrics.jsonl`, `summary.json`, the resolved config, and Weights & Biases.

The JSONL file and `summary.json` are always written (in the run folder, by the main
process); W&B mirrors them. W&B's mode comes from the config when it sets one, else from
the `WANDB_MODE` environment variable, else `offline` (works with no account or network).

What W&B gets, so that a run reads at a glance: a name (the experiment in short form), a
group (the sweep), a job type (the pipeline) and tags; metrics under `train/`, `val/`,
`prune/`, `sparsity/`, `perf/` (numbers only: strings and raw lists stay in the JSONL file);
epoch-based metrics on an `epoch` axis (`define_metric`); histograms and tables through
`log_histogram` and `log_table` (with a line plot); and `summary.json` with the final
tables as an artifact.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from horst_sparse.training.config import RunError

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.yaml"
FAILED_FILE = "failed.json"  # instead of summary.json: a run that stopped on an error (horst_sparse.training.runner)
_WANDB_ID_FILE = "wandb_id.txt"


class LogLines:
    """What a progress bar shows, as plain lines for a log file (a batch job's output, a pipe):
    one line per `set_postfix`, which the pipelines call at their log interval, with the bar's
    description, the step and the postfix (the training loss among it). tqdm's API, the parts
    the pipelines use."""

    def __init__(self, *, total: int, initial: int = 0, desc: str | None = None, disable: bool = False) -> None:
        self.total, self.n, self.desc, self.disable = total, initial, desc, disable

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def set_postfix(self, refresh: bool = False, **values: Any) -> None:
        if not self.disable:
            fields = " ".join(f"{key} {value}" for key, value in values.items())
            print(f"{self.desc or 'train'}: step {self.n}/{self.total} {fields}", flush=True)

    def write(self, text: str) -> None:
        if not self.disable:
            print(text, flush=True)

    def close(self) -> None:
        pass


class Labelled:
    """A text stream that starts every line (and every `\\r` redraw) with a run's label: the
    output of runs side by side (a multirun's parallel launcher) stays readable line by line."""

    def __init__(self, stream: Any, label: str) -> None:
        self.stream, self.prefix, self.at_line_start = stream, f"[{label}] ", True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self.at_line_start:
                out.append(self.prefix)
            out.append(piece)
            self.at_line_start = piece.endswith(("\n", "\r"))
        self.stream.write("".join(out))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, encoding, ...: the stream's own
        return getattr(self.stream, name)


@contextlib.contextmanager
def labelled_output(label: str):
    """stdout and stderr as `Labelled` streams for the duration."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Labelled(sys.stdout, label), Labelled(sys.stderr, label)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def progress_bar(*, total: int, initial: int = 0, desc: str | None = None, disable: bool = False):
    """tqdm's bar on a terminal; plain `LogLines` where stderr is not one (no `\\r` redraws in
    a log file) or is labelled (two bars redrawing one terminal line overwrite each other)."""
    if sys.stderr.isatty() and not isinstance(sys.stderr, Labelled):
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, desc=desc, disable=disable, dynamic_ncols=True)
    return LogLines(total=total, initial=initial, desc=desc, disable=disable)


def git_commit(path: str | os.PathLike = ".") -> str:
    """The commit of the repository holding `path`, with `-dirty` for local changes."""
    try:
        repo = Path(path).resolve().parent if Path(path).is_file() else Path(path).resolve()
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
        return commit + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _jsonable(value: Any) -> Any:
    """Plain JSON values; non-finite floats become None (JSON has no NaN)."""
    if hasattr(value, "tolist"):  # tensors and numpy arrays or scalars
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def cpu_model() -> str:
    """The CPU's model name (`platform.processor()` says only `x86_64` on Linux)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model")):  # x86; ARM boards
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict[str, Any]:
    """What a result was computed with: library versions, devices, host, CPU (model, the SIMD
    capability torch dispatches to: numbers differ in their last digits between them), threads,
    and whether the reproducible CPU mode was in force (`horst_sparse.cpu_mode`: then the same
    bits on any x86 CPU with AVX2 at the same thread count), with each library's code path."""
    import importlib.metadata
    import platform
    import socket

    import torch

    from horst_sparse import cpu_mode

    versions = {}
    for package in ("torch", "timm", "transformers", "datasets", "hydra-core", "wandb", "numpy"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    cuda = torch.cuda.is_available()
    return {
        "versions": {
            **versions,
            "python": platform.python_version(),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
        },
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_threads": torch.get_num_threads(),
        "reproducible_cpu": (mode := cpu_mode.state())["reproducible"],
        "cpu_mode": mode,
        "host": socket.gethostname(),
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def optimizer_label(optimizer: Mapping[str, Any]) -> str:
    """`horst(a=100,b=1)`: the optimizer and the hyperparameters that tell its runs apart."""
    keys = [("alpha", "a"), ("beta", "b")] + ([("order", "order")] if optimizer.get("order", "ms") != "ms" else [])
    values = ",".join(
        f"{short}={optimizer[key]:g}" if key != "order" else f"order={optimizer[key]}"
        for key, short in keys
        if key in optimizer
    )
    return f"{optimizer['name']}({values})" if values else optimizer["name"]


def _records_until(metrics: Path, step: int) -> list[str]:
    """JSONL lines up to the checkpoint marker of `step` (or up to `step` without one)."""
    lines, records = [], []
    for line in metrics.read_text().splitlines():
        try:
            records.append(json.loads(line))
            lines.append(line)
        except json.JSONDecodeError:  # a line cut short by the kill
            break
    markers = [i for i, r in enumerate(records) if r.get("event") == "checkpoint" and r["step"] == step]
    if markers:
        return lines[: markers[-1] + 1]
    return [line for line, r in zip(lines, records) if r["step"] <= step]


def wandb_mode(configured: str | None) -> str:
    mode = configured or os.environ.get("WANDB_MODE") or "offline"
    if mode not in ("online", "offline", "disabled"):
        raise ValueError(f"unknown W&B mode {mode!r}; use online, offline or disabled")
    return mode


def write_json_atomic(path: str | os.PathLike, data: Mapping[str, Any]) -> Path:
    """Write `data` as JSON to `path` (temporary file + rename: never a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(data), indent=2) + "\n")
    os.replace(tmp, path)
    return path


class RunLogger:
    """Logs metrics of one run; a no-op on non-main processes.

    On resume, `resume_step` drops the JSONL records written after the checkpoint of that
    step (the interrupted run's, about to be recomputed), so the log of a resumed run reads
    like that of an uninterrupted one. `checkpoint()` marks where each checkpoint was taken.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        config: Mapping[str, Any],
        *,
        enabled: bool = True,
        project: str = "horst",
        name: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        job_type: str | None = None,
        epoch_metrics: tuple[str, ...] = (),
        mode: str | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.commit = git_commit(Path(__file__).parent)
        self._wandb = None
        self.offline_dir: Path | None = None  # the offline W&B run's folder, for `wandb sync`
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / CONFIG_FILE, "w") as f:
            yaml.safe_dump(_jsonable(dict(config)), f, sort_keys=False)
        metrics = self.run_dir / METRICS_FILE
        if resume_step is None:
            metrics.unlink(missing_ok=True)
        elif metrics.exists():
            metrics.write_text("".join(line + "\n" for line in _records_until(metrics, resume_step)))
        self._metrics = open(metrics, "a")

        mode = wandb_mode(mode)
        if mode != "disabled":
            import wandb

            # One W&B run per run folder, continued across resumes. Online, W&B resumes it by its
            # id. Offline, W&B cannot append to a run's folder: the continued run starts a new
            # offline folder, which then gets the whole log, replayed from metrics.jsonl (cut at
            # the checkpoint), and the old one goes; `wandb sync` uploads one folder per run.
            id_file = self.run_dir / _WANDB_ID_FILE
            run_id = id_file.read_text().strip() if id_file.exists() else None
            if mode == "offline" and run_id:
                for old in (self.run_dir / "wandb").glob(f"offline-run-*-{run_id}"):
                    shutil.rmtree(old)
            try:
                self._wandb = wandb.init(
                    project=project,
                    name=name,
                    group=group,
                    tags=tags,
                    job_type=job_type,
                    id=run_id,
                    resume="allow" if mode == "online" else None,
                    dir=str(self.run_dir),
                    mode=mode,
                    config={**_jsonable(dict(config)), "git_commit": self.commit},
                )
            except (wandb.errors.UsageError, wandb.errors.CommError, wandb.errors.AuthenticationError) as error:
                raise RunError(
                    f"W&B could not start a {mode} run ({str(error).splitlines()[0]}): run `wandb login` or set "
                    "WANDB_API_KEY, or log offline (logging.mode=offline) and upload later with `wandb sync`"
                ) from None
            id_file.write_text(self._wandb.id)
            self.offline_dir = Path(self._wandb.settings.sync_dir) if mode == "offline" else None
            if epoch_metrics:  # charted against the epoch, not the update count
                self._wandb.define_metric("epoch")
                for pattern in epoch_metrics:
                    self._wandb.define_metric(pattern, step_metric="epoch")
            if self.offline_dir is not None and resume_step is not None:
                self._replay(metrics)

    def _replay(self, metrics: Path) -> None:
        """Log the records of `metrics` to W&B as they were logged live: numbers, and the
        weight histograms kept as counts and edges."""
        for line in metrics.read_text().splitlines():
            record = json.loads(line)
            if record.get("event"):
                continue
            numbers = {k: v for k, v in record.items() if k not in ("step", "time") and _is_number(v)}
            if numbers and record.get("wandb", True):
                self._to_wandb("log", numbers, step=record["step"])
            for key in [k.removesuffix("_counts") for k in record if k.endswith("_counts")]:
                if f"{key}_edges" in record:
                    self.log_histogram(key, record[f"{key}_counts"], record[f"{key}_edges"], step=record["step"])

    def log(self, metrics: Mapping[str, Any], *, step: int, to_wandb: bool = True) -> None:
        if not self.enabled:
            return
        record = {"step": step, "time": time.time(), **_jsonable(metrics)}
        if not to_wandb:
            record["wandb"] = False  # a JSONL-only record: an offline resume's replay (`_replay`) skips it too
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()
        if self._wandb is not None and to_wandb:
            numbers = {k: v for k, v in record.items() if k not in ("step", "time") and _is_number(v)}
            self._to_wandb("log", numbers, step=step)

    def _to_wandb(self, method: str, *args: Any, **kwargs: Any) -> None:
        """The W&B run's `method` (dotted: `summary.update`) with these arguments; where its service
        process is gone (`_service_ended`), the run goes on without W&B."""
        if self._wandb is None:
            return
        target = self._wandb
        for name in method.split("."):
            target = getattr(target, name)
        try:
            target(*args, **kwargs)
        except OSError:  # the socket to wandb-core: reset, broken pipe
            self._wandb = None
            self._service_ended()

    def log_histogram(self, key: str, counts: Any, edges: Any, *, step: int) -> None:
        """A histogram for W&B (the JSONL file keeps counts and edges where the caller logs them)."""
        if self._wandb is not None:
            import wandb

            histogram = wandb.Histogram(np_histogram=(np.asarray(counts), np.asarray(edges)))
            self._to_wandb("log", {key: histogram}, step=step)

    def log_table(
        self, key: str, rows: list[Mapping[str, Any]], *, step: int, plot: tuple[str, str, str] | None = None
    ) -> None:
        """Rows (dicts with the same keys) as a W&B table, and with `plot=(x, y, title)` a line
        plot of y against x beside it."""
        if self._wandb is None or not rows:
            return
        import wandb

        columns = list(rows[0])
        table = wandb.Table(columns=columns, data=[[_jsonable(r[c]) for c in columns] for r in rows])
        entries = {key: table}
        if plot is not None:
            x, y, title = plot
            entries[f"{key}_plot"] = wandb.plot.line(table, x, y, title=title)
        self._to_wandb("log", entries, step=step)

    def checkpoint(self, path: str | os.PathLike, *, step: int) -> None:
        """Mark the checkpoint of `step` (the resume point in the log). Call it just before
        writing the checkpoint file: a run killed in between resumes from an earlier
        checkpoint, whose marker precedes this one, so the log is still cut correctly."""
        if self.enabled:
            self._metrics.write(json.dumps({"step": step, "event": "checkpoint", "path": str(path)}) + "\n")
            self._metrics.flush()

    def write_json(self, filename: str, data: Mapping[str, Any]) -> Path:
        """Write a JSON file into the run folder (temp file + rename)."""
        path = self.run_dir / filename
        if self.enabled:
            write_json_atomic(path, data)
        return path

    def write_text(self, filename: str, text: str) -> Path:
        path = self.run_dir / filename
        if self.enabled:
            path.write_text(text)
        return path

    def summary(self, data: Mapping[str, Any], *, files: tuple[str, ...] = ()) -> dict[str, Any]:
        """Write `summary.json` (final metrics, self-describing), mirror it to W&B's summary, and
        log it with the run folder's `files` (the final tables) as a W&B artifact; return it."""
        data = _jsonable(
            {**data, "git_commit": self.commit, "environment": environment(), "run_dir": str(self.run_dir.resolve())}
        )
        self.write_json(SUMMARY_FILE, data)
        if self._wandb is not None:
            import wandb

            artifact = wandb.Artifact(
                f"results-{self._wandb.id}", type="results", description="summary.json and tables"
            )
            for name in (SUMMARY_FILE, *files):
                if (self.run_dir / name).is_file():
                    artifact.add_file(str(self.run_dir / name))
            self._to_wandb("summary.update", data)
            self._to_wandb("log_artifact", artifact)
        return data

    def close(self, *, exit_code: int = 0) -> None:
        if not self.enabled:
            return
        self._metrics.close()
        if self._wandb is not None:
            self._to_wandb("finish", exit_code=exit_code)
            if self._wandb is None:  # its service process was gone
                return
            self._wandb = None
            if self.offline_dir is not None:
                print(f"W&B offline run: upload it with `wandb sync {self.offline_dir}`", flush=True)

    def _service_ended(self) -> None:
        """W&B's service process (wandb-core, a child of this one) ended before the run finished:
        SLURM signals every process of a job on scancel and preemption, and wandb-core exits on
        SIGTERM at once. What it had not written is lost to W&B; the JSONL log has it all. Its
        connection is torn down here, so wandb's exit hook does not print a traceback at exit and
        a later run in this process starts a new service."""
        import wandb

        with contextlib.suppress(OSError):
            wandb.teardown()
        after = (
            "the continued run replays the whole log into a new offline folder"
            if self.offline_dir is not None
            else "the continued run goes on logging it"
        )
        print(
            f"W&B: its service process ended before this run's W&B record was closed (SLURM signals every "
            f"process of a job); {METRICS_FILE} holds every step, and {after}",
            file=sys.stderr,
            flush=True,
        )
