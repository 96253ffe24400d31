"""A study's protocol, versioned (horst_sparse/study/protocol.py, protocols/): every version's file
and the files it names hash to what its recorded rows say, a changed file is refused as a new
version, the record holds every version's runs, and the confirmatory version reports on fresh seeds."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
from conftest import ROOT

from horst_sparse.analysis.runs import read_record
from horst_sparse.study import protocol
from horst_sparse.study import run as study


def test_every_version_loads_in_order_and_the_newest_is_confirmatory_and_runnable():
    versions = protocol.versions("embedded")
    assert [v.version for v in versions] == list(range(1, len(versions) + 1))
    assert all(v.status in protocol.STATUSES and v.why for v in versions)
    current = protocol.current("embedded")
    assert current.status == "confirmatory" and current.runnable
    assert study.presets_of("embedded") == sorted(current.presets)
    # an earlier version was recorded after the fact (no presets: the commit of its runs) or superseded
    # (v3: its files changed under the newer version's registration, after its last row)
    assert all(not v.runnable or v.hash != v_next.hash for v, v_next in zip(versions, versions[1:]))


def test_recorded_rows_carry_the_hash_of_their_versions_files():
    """No file of a version was edited after its rows were recorded (runs.csv and tuning.csv): every
    row carries the hash its version's files had when the version was registered (its file's first
    commit; a later version may change a file an earlier one names: v4 changed v3's search spaces,
    v6 v4's), and the current version's files still hash to it."""
    versions = {v.version: v for v in protocol.versions("embedded")}
    record = read_record([ROOT / "results" / "embedded" / "runs.csv"])
    tuning = pd.concat([pd.read_csv(p) for p in (ROOT / "results" / "tuning").glob("*/*/tuning.csv")])
    for rows in (record, tuning[tuning.protocol.notna()]):
        for version, recorded in rows.groupby(rows.protocol.astype(int)).protocol_hash.unique().items():
            assert list(recorded) == [protocol.registered_hash(versions[version])], version
    current = versions[max(versions)]
    assert protocol.registered_hash(current) == current.hash


def test_a_superseded_versions_hash_is_the_one_of_its_files_at_its_commits():
    """v3 (registered at 5dcbb6b) hashed to 9aced3e74afcefeb there; v4 changed files it names."""
    v3 = protocol.versions("embedded")[2]
    assert protocol.hash_at(v3, "5dcbb6b237d28cbfd7d16bd8f00ea443a4043c2c") == "9aced3e74afcefeb" != v3.hash
    with pytest.raises(protocol.ProtocolError, match="protocols/embedded/v3.yaml is not in commit 2d37828"):
        protocol.hash_at(v3, "2d37828f0c1f6c970d93148660a3b8493a56c80f")


def test_the_record_holds_the_600_and_300_update_gpt2_runs_as_their_versions():
    record = read_record([ROOT / "results" / "embedded" / "runs.csv"])
    gpt2 = record[record.pipeline == "gpt2"].drop_duplicates(["protocol", "run"])
    counts = gpt2.groupby("protocol").run.nunique()
    assert counts[1] == 40 and counts[2] == 40
    assert set(gpt2[gpt2.protocol == 1].git_commit) != set(gpt2[gpt2.protocol == 2].git_commit)


def test_the_confirmatory_version_reports_on_fresh_seeds():
    """Every earlier version reported on seeds 0-9, whose results have been read."""
    jobs = study.study_jobs(study.presets_of("embedded"))
    assert {j.seed for j in jobs} == set(range(10, 20))
    record = read_record([ROOT / "results" / "embedded" / "runs.csv"])
    assert set(record[record.protocol < protocol.current("embedded").version].seed) <= set(range(10))


def test_a_changed_file_is_a_new_version(tmp_path):
    root = tmp_path / "repo"
    (root / "protocols" / "demo").mkdir(parents=True)
    shutil.copy(ROOT / "protocols" / "embedded" / "claims_v2.yaml", root / "protocols" / "demo" / "claims.yaml")
    (root / "recipe.yaml").write_text("steps: 600\n")
    (root / "protocols" / "demo" / "v1.yaml").write_text(
        "study: demo\nversion: 1\nstatus: confirmatory\nwhy: a test\nclaims: protocols/demo/claims.yaml\n"
        "files: [recipe.yaml]\n"
    )
    before = protocol.current("demo", root)
    protocol.check_unchanged(before, [before.hash, None])
    (root / "recipe.yaml").write_text("steps: 300\n")
    after = protocol.current("demo", root)
    assert after.hash != before.hash
    with pytest.raises(protocol.ProtocolError, match="changed after its runs began.*v2.yaml"):
        protocol.check_unchanged(after, [before.hash])


def test_a_version_that_declares_edges_only_runs_at_the_earlier_versions_tunings(tmp_path):
    """v5 = v4 + declared edges: the same tunings, not redone; one that changes more must tune."""
    root = tmp_path / "repo"
    (root / "protocols" / "demo").mkdir(parents=True)
    shutil.copy(ROOT / "protocols" / "embedded" / "claims_v2.yaml", root / "protocols" / "demo" / "claims.yaml")
    (root / "recipe.yaml").write_text("steps: 600\n")
    spec = (
        "study: demo\nstatus: confirmatory\nwhy: a test\nclaims: protocols/demo/claims.yaml\nfiles: [recipe.yaml]\n"
        "tuning: {trials: {vit: 16}, declared_edges: [%s]}\n"
    )
    (root / "protocols" / "demo" / "v1.yaml").write_text("version: 1\n" + spec % "")
    (root / "protocols" / "demo" / "v2.yaml").write_text(
        "version: 2\ntunings_from: 1\n" + spec % "ham optimizer.alpha at the lower edge"
    )
    versions = protocol.versions("demo", root)
    assert protocol.tuned_under(versions[1], versions) is versions[0] and versions[0].hash != versions[1].hash
    assert protocol.tuned_under(versions[0], versions) is versions[0]
    (root / "protocols" / "demo" / "v2.yaml").write_text(
        "version: 2\ntunings_from: 1\n" + (spec % "").replace("vit: 16", "vit: 8")
    )
    with pytest.raises(protocol.ProtocolError, match="differs from it in more than its declared edges"):
        protocol.tuned_under(protocol.versions("demo", root)[1], protocol.versions("demo", root))


def test_the_current_version_runs_at_v4s_tunings_and_declares_the_mirror_arms_adamw_corner():
    versions = protocol.versions("embedded")
    assert protocol.tuned_under(versions[-1], versions).version == 4
    assert versions[-1].declared_edges == [
        f"{arm} optimizer.alpha at the lower edge" for arm in ("ham", "horst", "horst_prunable")
    ]


def test_a_protocol_file_names_its_version_and_what_it_lacks(tmp_path):
    (tmp_path / "protocols" / "demo").mkdir(parents=True)
    bad = tmp_path / "protocols" / "demo" / "v2.yaml"
    bad.write_text("study: demo\nversion: 3\nstatus: confirmatory\nwhy: x\nclaims: c.yaml\n")
    with pytest.raises(protocol.ProtocolError, match="name it v3.yaml"):
        protocol.load(bad, tmp_path)
    bad.write_text("study: demo\nversion: 2\n")
    with pytest.raises(protocol.ProtocolError, match="lacks status, why, claims"):
        protocol.load(bad, tmp_path)
