"""A study's protocol: one committed file per version (`protocols/<study>/v<N>.yaml`) that fixes,
before its reporting runs, what the study runs and how it is judged: its presets (arms,
sparsities, seeds), the tuning budget (trials, top-k reruns, seeds), the search spaces, the
pilot's rule, the claims' rules and the declared edges.

Its hash is the SHA-256 of the protocol file and of every file it names (`files`), so a changed
recipe, search space, preset or rule after the first run changes it. Every row the study and its
tunings record carries the version and hash (`protocol`, `protocol_hash` in runs.csv and
tuning.csv); a version whose files changed after its runs began is refused (`check_unchanged`):
a change after results were read is a new version, run beside the old one, never in its place.
Versions never deleted: the record holds every version's runs and the report judges each.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from horst_sparse.paths import REPO

PROTOCOLS = REPO / "protocols"
STATUSES = ("confirmatory", "exploratory")


class ProtocolError(RuntimeError):
    """A protocol that cannot be read or has changed under its runs; one line, with the fix."""


@dataclasses.dataclass(frozen=True)
class Protocol:
    study: str
    version: int
    status: str  # confirmatory | exploratory
    why: str  # what it changed from the version before, and why (or why it is exploratory)
    path: Path
    hash: str
    spec: Mapping[str, Any]  # the whole file

    @property
    def label(self) -> str:
        return f"v{self.version} ({self.status})"

    @property
    def presets(self) -> list[str]:
        return list(self.spec.get("presets") or [])

    @property
    def runnable(self) -> bool:
        """Whether the study can still run this version: it names presets of the current configs
        (a version recorded after the fact names the commit its runs came from instead)."""
        return bool(self.presets)

    @property
    def claims(self) -> Path:
        return REPO / self.spec["claims"]

    @property
    def tuning(self) -> Mapping[str, Any]:
        return self.spec.get("tuning") or {}

    @property
    def declared_edges(self) -> list[str]:
        return list(self.tuning.get("declared_edges") or [])


def _hash(path: str, files: Iterable[str], read: Callable[[str], bytes | None]) -> str:
    """The hash of the protocol file `path` and the files it names, each read by `read` (None: missing)."""
    digest = hashlib.sha256()
    for name in [path, *sorted(files)]:
        data = read(name)
        if data is None:
            raise ProtocolError(f"{path} names {name}, which does not exist")
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()[:16]


def _named_files(spec: Mapping[str, Any]) -> set[str]:
    return {*spec.get("files", []), spec["claims"], *(f"configs/study/{p}.yaml" for p in spec.get("presets") or [])}


def load(path: Path, root: Path = REPO) -> Protocol:
    path = Path(path).resolve()
    spec = yaml.safe_load(path.read_text()) or {}
    missing = [k for k in ("study", "version", "status", "why", "claims") if k not in spec]
    if missing:
        raise ProtocolError(f"{path} lacks {', '.join(missing)}")
    if spec["status"] not in STATUSES:
        raise ProtocolError(f"{path}: status {spec['status']!r} is not one of {', '.join(STATUSES)}")
    if path.stem != f"v{spec['version']}":
        raise ProtocolError(f"{path} says version {spec['version']}: name it v{spec['version']}.yaml")
    root = Path(root).resolve()
    return Protocol(
        spec["study"],
        int(spec["version"]),
        spec["status"],
        " ".join(str(spec["why"]).split()),
        path,
        _hash(str(path.relative_to(root)), _named_files(spec), lambda name: _read(root / name)),
        spec,
    )


def _read(file: Path) -> bytes | None:
    return file.read_bytes() if file.is_file() else None


def hash_at(protocol: Protocol, commit: str, root: Path = REPO) -> str:
    """The hash of the version's files as they were at `commit` (git): a version superseded by a
    newer one keeps the hash its rows recorded there, though files it shares with the newer
    version (a search space, a preset) have changed since."""

    def read(name: str) -> bytes | None:
        shown = subprocess.run(["git", "show", f"{commit}:{name}"], cwd=root, capture_output=True)
        return shown.stdout if shown.returncode == 0 else None

    name = str(protocol.path.relative_to(Path(root).resolve()))
    spec = yaml.safe_load(read(name) or b"") or {}
    if not spec:
        raise ProtocolError(f"{name} is not in commit {commit} (git log -- {name})")
    return _hash(name, _named_files(spec), read)


def versions(study: str, root: Path = REPO) -> list[Protocol]:
    """Every version of the study's protocol, oldest first."""
    folder = root / "protocols" / study
    found = sorted(folder.glob("v*.yaml"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    if not found:
        raise ProtocolError(f"no protocol for study {study} ({folder}/v<N>.yaml)")
    return [load(p, root) for p in found]


def current(study: str, root: Path = REPO) -> Protocol:
    """The version the study runs: the newest."""
    return versions(study, root)[-1]


def tuned_under(protocol: Protocol, versions: Iterable[Protocol]) -> Protocol:
    """The version whose tunings `protocol` runs at: itself, or the earlier version its
    `tunings_from` names (v5 and v6 run at v4's). It must have the same presets, files, claims and
    budget; its declared edges may differ, and the arms it names in `retune` ("<pipeline> <arm>",
    tuned anew under it) may have changed search spaces (`retuned_files`). The earlier version's
    picks carry the hash its files had when it was registered (`registered_hash`)."""
    source = protocol.spec.get("tunings_from")
    if source is None:
        return protocol
    earlier = next((v for v in versions if v.version == source), None)
    if earlier is None or earlier.version >= protocol.version:
        raise ProtocolError(f"{protocol.path.name}: tunings_from: {source} names no earlier version")
    same = ("presets", "files", "claims")
    budget = {k: v for k, v in protocol.tuning.items() if k != "declared_edges"}
    if any(protocol.spec.get(k) != earlier.spec.get(k) for k in same) or budget != {
        k: v for k, v in earlier.tuning.items() if k != "declared_edges"
    }:
        raise ProtocolError(
            f"{protocol.path.name} takes the tunings of v{source} but differs from it in more than its declared "
            f"edges and retuned arms: give it tunings of its own (drop tunings_from)"
        )
    return earlier


def retuned(protocol: Protocol) -> set[tuple[str, str]]:
    """The (pipeline, arm) a version that takes an earlier version's tunings tunes anew."""
    return {tuple(entry.split()) for entry in protocol.spec.get("retune") or []}


def retuned_files(protocol: Protocol) -> set[str]:
    return {f"configs/hparams_search/{pipeline}_{arm}.yaml" for pipeline, arm in retuned(protocol)}


def registration(protocol: Protocol, root: Path = REPO) -> str | None:
    """The commit that added the version's file (None: not committed yet)."""
    name = str(protocol.path.relative_to(Path(root).resolve()))
    log = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", name], cwd=root, capture_output=True, text=True
    )
    added = log.stdout.split()
    return added[-1] if added else None


def registered_hash(protocol: Protocol, root: Path = REPO) -> str:
    """The hash of the version's files when it was registered (its file's first commit): what its
    rows recorded, though a later version has since changed a file it names (v6: a search space)."""
    commit = registration(protocol, root)
    return protocol.hash if commit is None else hash_at(protocol, commit, root)


def check_inherited(protocol: Protocol, earlier: Protocol, root: Path = REPO) -> None:
    """The files the earlier version named changed since its registration only where `protocol`
    retunes: every other arm's tuning stands as it was made."""
    commit = registration(earlier, root)
    if commit is None:
        raise ProtocolError(f"{earlier.path.name} is not committed: commit it before a version takes its tunings")
    changed = []
    for name in sorted(_named_files(earlier.spec)):
        then = subprocess.run(["git", "show", f"{commit}:{name}"], cwd=root, capture_output=True).stdout
        if then != _read(Path(root) / name):
            changed.append(name)
    extra = sorted(set(changed) - retuned_files(protocol))
    if extra:
        raise ProtocolError(
            f"{', '.join(extra)} changed since v{earlier.version} was registered, but {protocol.path.name} takes "
            f"v{earlier.version}'s tunings: restore them, or name the arms they concern in its retune"
        )


def check_unchanged(protocol: Protocol, recorded: Iterable[Any], expected: str | None = None) -> None:
    """Refuse to add runs to a version whose files changed since its first recorded runs (or
    whose recorded hashes are not `expected`: an earlier version's at its registration)."""
    hashes = {str(h) for h in recorded if isinstance(h, str) and h}
    changed = hashes - {expected or protocol.hash}
    if changed:
        raise ProtocolError(
            f"protocol {protocol.study} v{protocol.version} changed after its runs began (recorded hash "
            f"{', '.join(sorted(changed))}, its files now hash to {protocol.hash}): a change after runs were "
            f"recorded is a new version; restore its files (git log -- protocols/{protocol.study}) or "
            f"write protocols/{protocol.study}/v{protocol.version + 1}.yaml"
        )
