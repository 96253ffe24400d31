"""A study's protocol: one committed file per version (`protocols/<study>/v<N>.yaml`) that fixes,
before its reporting runs, what the study runs and how it is judged: its presets (arms,
sparsities, seeds), the tuning budget (trials, top-k reruns, seeds), the search spaces, the
pilot's rule, the claims' rules and the declared edges. A version's file holds what differs from
the version it extends (`extends: <N>`, merged over it key by key); its OWN keys are never taken.

Git is the ledger. A version is registered by the commit that adds its file. Every row the
study and its tunings record carries the version (`protocol`) and the commit it was made at; a
version is unchanged at a commit where the files it names are as at its registration (`git
diff`; its own file compared once merged) but for a reviewed change: a version's `retune` names
the arms whose search spaces it changes, from what the version whose tunings it takes registered
to what it registers, and only that arm's tuning reads such a file. A change after registration
is a new version, run beside the old one; versions are never deleted.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from horst_sparse.paths import REPO

STATUSES = ("confirmatory", "exploratory")
# What a version states for itself. `hash`: the label of v1-v6's rows (their `protocol_hash`, the
# SHA-256 of their files when registered); a version registered since is labelled by its commit.
OWN = ("version", "why", "hash", "tunings_from", "retune")


class ProtocolError(RuntimeError):
    """A protocol that cannot be read or has changed under its runs; one line, with the fix."""


@dataclasses.dataclass(frozen=True)
class Protocol:
    study: str
    version: int
    status: str  # confirmatory | exploratory
    why: str  # what it changed from the version before, and why (or why it is exploratory)
    path: Path
    spec: Mapping[str, Any]  # its file, merged over the version it extends
    registration: str | None  # the commit that added its file (None: not committed)
    root: Path  # the repository

    @property
    def label(self) -> str:
        return f"v{self.version} ({self.status})"

    @property
    def hash(self) -> str | None:
        """What its rows carry as `protocol_hash`: its registering commit, or v1-v6's recorded hash."""
        return self.spec.get("hash") or self.registration

    @property
    def presets(self) -> list[str]:
        return list(self.spec.get("presets") or [])

    @property
    def claims(self) -> Path:
        return REPO / self.spec["claims"]

    @property
    def tuning(self) -> Mapping[str, Any]:
        return self.spec.get("tuning") or {}

    @property
    def declared_edges(self) -> list[str]:
        return list(self.tuning.get("declared_edges") or [])

    @property
    def retuned(self) -> set[tuple[str, str]]:
        """The (pipeline, arm) a version that takes an earlier version's tunings tunes anew."""
        return {tuple(entry.split()) for entry in self.spec.get("retune") or []}

    def fixed_at(self, commit: str | None) -> dict[str, Any] | None:
        """What its file fixes at `commit` (None: the working tree), merged, its label (`hash`) aside;
        None where the commit lacks the file."""
        name, read = str(self.path.relative_to(self.root)), _reader(self.root, commit)
        if read(name) is None:
            return None
        return {k: v for k, v in _spec(name, read).items() if k != "hash"}


def _named(spec: Mapping[str, Any]) -> set[str]:
    """What a version fixes besides its own file: `files`, the claims' rules, the presets."""
    return {*spec.get("files", []), spec["claims"], *(f"configs/study/{p}.yaml" for p in spec.get("presets") or [])}


def _merge(base: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in own.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def _spec(name: str, read: Callable[[str], str | None]) -> dict[str, Any]:
    """The version file `name` (as `read` gives it) merged over the versions it extends."""
    text = read(name)
    if text is None:
        raise ProtocolError(f"{name} does not exist")
    own = yaml.safe_load(text) or {}
    if "extends" not in own:
        return own
    base = _spec(str(Path(name).with_name(f"v{own.pop('extends')}.yaml")), read)
    return _merge({k: v for k, v in base.items() if k not in OWN}, own)


def _reader(root: Path, commit: str | None) -> Callable[[str], str | None]:
    """A file's text at `commit` (None: the working tree), None where it has none."""

    def read(name: str) -> str | None:
        if commit is None:
            return (root / name).read_text() if (root / name).is_file() else None
        shown = subprocess.run(["git", "show", f"{commit}:{name}"], cwd=root, capture_output=True, text=True)
        return shown.stdout if shown.returncode == 0 else None

    return read


def load(path: Path, root: Path = REPO) -> Protocol:
    path, root = Path(path).resolve(), Path(root).resolve()
    name = str(path.relative_to(root))
    spec = _spec(name, _reader(root, None))
    if missing := [k for k in ("study", "version", "status", "why", "claims") if k not in spec]:
        raise ProtocolError(f"{path} lacks {', '.join(missing)}")
    if spec["status"] not in STATUSES:
        raise ProtocolError(f"{path}: status {spec['status']!r} is not one of {', '.join(STATUSES)}")
    if path.stem != f"v{spec['version']}":
        raise ProtocolError(f"{path} says version {spec['version']}: name it v{spec['version']}.yaml")
    log = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", name], cwd=root, capture_output=True)
    registration = (log.stdout.decode().split() or [None])[-1]
    # A version names the files as it fixed them at its registration (the configs may move on since, and
    # check_unchanged refuses to run it then) or as they are in the working tree (before it is committed).
    named = _named(spec)
    present = {f for f in named if (root / f).is_file()} | (
        _files_at(registration, named, root) if registration else set()
    )
    if absent := sorted(named - present):
        raise ProtocolError(f"{name} names {absent[0]}, which does not exist: restore it or name another file")
    why = " ".join(str(spec["why"]).split())
    return Protocol(spec["study"], int(spec["version"]), spec["status"], why, path, spec, registration, root)


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
    tuned anew under it) may have changed search spaces."""
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


def _files_at(commit: str, names: Iterable[str], root: Path) -> set[str]:
    """Those of `names` that are files at `commit`."""
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", commit, "--", *names], cwd=root, capture_output=True
    )
    return set(listed.stdout.decode().split())


def _blobs(path: str, commits: Iterable[str | None], root: Path) -> frozenset[str]:
    """The git blob ids of `path` at `commits` (None: the working tree's file; '' where it has none)."""
    args = [["hash-object", path] if c is None else ["rev-parse", "--verify", "-q", f"{c}:{path}"] for c in commits]
    return frozenset(subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout.strip() for a in args)


def reviewed(versions: Iterable[Protocol]) -> set[tuple[str, frozenset[str]]]:
    """The reviewed changes, each (path, {blob before, blob after}): the search space of each arm a
    version retunes, as the version whose tunings it takes registered it and as it registered it."""
    by_version = {v.version: v for v in versions}
    return {
        (
            path,
            _blobs(path, [by_version[version.spec["tunings_from"]].registration, version.registration], version.root),
        )
        for version in by_version.values()
        for path in (f"configs/hparams_search/{pipeline}_{arm}.yaml" for pipeline, arm in version.retuned)
    }


def is_reviewed(path: str, commits: tuple[str | None, str | None], changes: set, root: Path = REPO) -> bool:
    """Whether the file's change between the two commits (None: the working tree) is a reviewed one."""
    return (path, _blobs(path, commits, root)) in changes


def check_unchanged(protocol: Protocol, commits: Iterable[str | None], changes: set = frozenset()) -> None:
    """Refuse where a file the version names is at one of `commits` (None: the working tree) not as
    at its registration, but by a reviewed change (`changes`); where a commit lacks the version's
    own file (a run made before it: v5's ViT runs, which v6 counts) its named files alone are
    compared. A version recorded after its runs (`commit`: the record it names) fixed nothing."""
    if "commit" in protocol.spec:
        return
    if protocol.registration is None:
        raise ProtocolError(
            f"{protocol.path.relative_to(protocol.root)} is not committed: commit it (its registration) before "
            "its runs and tunings"
        )
    registered = protocol.fixed_at(protocol.registration)
    problems = []
    for commit in sorted(set(commits), key=str):
        where = [protocol.registration, *([commit] if commit else []), "--", *sorted(_named(registered))]
        diff = subprocess.run(["git", "diff", "--name-only", *where], cwd=protocol.root, capture_output=True, text=True)
        if diff.returncode:
            problems.append(f"{commit}: not a commit of this repository")
            continue
        pair = (protocol.registration, commit)
        changed = [f for f in diff.stdout.split() if not is_reviewed(f, pair, changes, protocol.root)]
        if protocol.fixed_at(commit) not in (None, registered):
            changed.append(str(protocol.path.relative_to(protocol.root)))
        if changed:
            problems.append(f"{commit[:12] if commit else 'the working tree'}: {', '.join(changed)}")
    if problems:
        raise ProtocolError(
            f"protocol {protocol.study} v{protocol.version} changed since its registration "
            f"({protocol.registration[:12]}): {'; '.join(problems)}; restore them (git diff "
            f"{protocol.registration[:12]} -- <file>) or register the change as a new version, a new "
            f"protocols/{protocol.study}/v<N>.yaml that names them (a changed search space alone: name its arm in its retune)"
        )
