"""The study's ledger over what is committed (`make check-results`; protocol.py says what a
version fixes). Three checks, each a list of problems (none: the ledger holds):

* `row_problems`: every row of the record (results/<study>/runs.csv) and of the tunings
  (results/tuning/*/*/tuning.csv), and every pick of configs/tuned/ (an arm's section of a
  recipe's file), carries its version's label (`protocol_hash`) and was made at a commit where the
  files its version names are as its registration left them (protocol.check_unchanged, the
  reviewed changes forgiven). The working tree is not judged: the configs move on after a
  version's runs (a new version names them); running a version whose files changed is refused by
  `horst-sparse study` itself.
* `version_file_problems`: every version's file, merged over the version it extends, still fixes
  what its registering commit fixed (the report reads a version's `why` and claims from it).
* `seed_problems`: the confirmatory versions report on seeds no exploratory version reported on
  (the exploratory results had been read when the confirmatory versions were written).

    python -m horst_sparse.study.ledger [study]    # default: embedded
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import yaml

from horst_sparse.paths import REPO
from horst_sparse.study import protocol

LABELS = ["protocol", "protocol_hash", "git_commit"]


def _labelled(path: Path, commit: str = "git_commit") -> pd.DataFrame:
    """The rows of a csv a version made (`commit`: its commit column), with their seed."""
    frame = pd.read_csv(path, dtype={"protocol_hash": str, commit: str})
    if "protocol" not in frame:
        return pd.DataFrame(columns=[*LABELS, "seed"])
    frame = frame.rename(columns={commit: "git_commit"})
    return frame[frame.protocol.notna()].reindex(columns=[*LABELS, "seed"])


def recorded(study: str, root: Path = REPO) -> pd.DataFrame:
    """(protocol, protocol_hash, git_commit) of every row of the record and the tunings and of
    every pick a version of `study` made."""
    parts = [_labelled(root / "results" / study / "runs.csv")]
    parts += [_labelled(p, "commit") for p in sorted((root / "results" / "tuning").glob("*/*/tuning.csv"))]
    picks = []
    for path in sorted((root / "configs" / "tuned").glob("*/*.yaml")):
        for section in (yaml.safe_load(path.read_text()) or {}).values():
            made = (section.get("provenance") if isinstance(section, dict) else None) or {}
            version = made.get("protocol") or {}
            if str(version.get("file", "")).startswith(f"protocols/{study}/"):
                picks.append(
                    {"protocol": version["version"], "protocol_hash": version["hash"], "git_commit": made["commit"]}
                )
    parts.append(pd.DataFrame(picks, columns=LABELS))
    made = [p[LABELS] for p in parts if not p.empty] or [pd.DataFrame(columns=LABELS)]
    frame = pd.concat(made, ignore_index=True).drop_duplicates()
    return frame.assign(protocol=frame.protocol.astype(int))


def row_problems(versions: list[protocol.Protocol], rows: pd.DataFrame) -> list[str]:
    by_number = {v.version: v for v in versions}
    reviewed = protocol.reviewed(versions)
    problems = []
    for number, part in rows.groupby("protocol"):
        version = by_number.get(number)
        if version is None:
            problems.append(f"{len(part)} row(s) of protocol v{number}, which protocols/{versions[0].study}/ lacks")
            continue
        labels = set(part.protocol_hash) - {version.hash}
        if labels:
            problems.append(f"v{number}: rows labelled {', '.join(sorted(labels))}, not the version's {version.hash}")
        try:
            protocol.check_unchanged(version, set(part.git_commit), reviewed)
        except protocol.ProtocolError as error:
            problems.append(str(error))
    return problems


def version_file_problems(versions: list[protocol.Protocol]) -> list[str]:
    problems = []
    for version in versions:
        if version.registration is None:
            problems.append(f"{version.path.name} is not committed: commit it (its registration)")
            continue
        name = str(version.path.relative_to(version.root))
        if version.fixed_at(None) != version.fixed_at(version.registration):
            problems.append(
                f"{name} fixes other values than its registration ({version.registration[:12]}) did: restore them "
                f"(git diff {version.registration[:12]} -- {name}); a change is a new version"
            )
    return problems


def seed_problems(versions: list[protocol.Protocol], record: pd.DataFrame) -> list[str]:
    """`record`: the study's runs.csv rows (a tuning's seeds are its own, not reporting seeds)."""
    status = {v.version: v.status for v in versions}
    seeds = record.assign(status=record.protocol.astype(int).map(status), seed=record.seed.astype(int))
    reused = set(seeds[seeds.status == "confirmatory"].seed) & set(seeds[seeds.status == "exploratory"].seed)
    if not reused:
        return []
    return [f"confirmatory rows on seed(s) {sorted(reused)}, which an exploratory version reported on: use fresh seeds"]


def problems(study: str, root: Path = REPO) -> list[str]:
    versions = protocol.versions(study, root)
    record = _labelled(root / "results" / study / "runs.csv")
    return (
        row_problems(versions, recorded(study, root))
        + version_file_problems(versions)
        + seed_problems(versions, record)
    )


def main(argv: list[str] | None = None) -> None:
    (study,) = (sys.argv[1:] if argv is None else argv) or ["embedded"]
    found = problems(study, REPO)
    for line in found:
        print(f"ledger: {line}")
    if found:
        sys.exit(1)
    print(f"ledger: every recorded row and pick of the {study} study is its version's, as registered")


if __name__ == "__main__":
    main()
