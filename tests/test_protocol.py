"""A study's protocol, versioned (horst_sparse/study/protocol.py, protocols/), with git as its
ledger: a version is registered by the commit that adds its file, every recorded row was made at
a commit where its version's files are as registered (or by a reviewed change), a changed file is
refused as a new version, the record holds every version's runs, and the confirmatory version
reports on fresh seeds."""

from __future__ import annotations

import shutil
import subprocess

import pandas as pd
import pytest
import yaml
from conftest import ROOT

from horst_sparse.analysis.runs import read_record
from horst_sparse.study import protocol
from horst_sparse.study import run as study

SPEC = "study: demo\nstatus: confirmatory\nwhy: a test\nclaims: protocols/demo/claims.yaml\nfiles: [{files}]\n"


def _git(repo, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A repository with a demo study's claims and a recipe, committed."""
    root = tmp_path / "repo"
    (root / "protocols" / "demo").mkdir(parents=True)
    shutil.copy(ROOT / "protocols" / "embedded" / "claims_v2.yaml", root / "protocols" / "demo" / "claims.yaml")
    (root / "recipe.yaml").write_text("steps: 600\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "a study")
    return root


def _register(root, version: int, text: str):
    (root / "protocols" / "demo" / f"v{version}.yaml").write_text(f"version: {version}\n" + text)
    _git(root, "add", ".")
    _git(root, "commit", "-qm", f"protocol v{version}")
    return protocol.versions("demo", root)


def test_every_version_loads_in_order_and_the_newest_is_confirmatory_and_runnable():
    versions = protocol.versions("embedded")
    assert [v.version for v in versions] == list(range(1, len(versions) + 1))
    assert all(v.status in protocol.STATUSES and v.why and v.registration for v in versions)
    current = protocol.current("embedded")
    assert current.status == "confirmatory" and current.runnable
    assert study.presets_of("embedded") == sorted(current.presets)
    assert len({v.hash for v in versions}) == len(versions)


def test_every_recorded_row_was_made_where_its_versions_files_were_as_registered():
    """Every row of runs.csv and tuning.csv, and every pick of configs/tuned, carries its version's
    label and was made at a commit where the files its version names are as that version's
    registering commit left them (git diff), but for v6's retune (GPT-2 HAM's search space): v6
    counts v5's ViT runs, made before v6 widened it, and v5's later ViT runs ran after it."""
    versions = {v.version: v for v in protocol.versions("embedded")}
    record = read_record([ROOT / "results" / "embedded" / "runs.csv"])
    tuning = pd.concat([pd.read_csv(p) for p in (ROOT / "results" / "tuning").glob("*/*/tuning.csv")])
    tuning = tuning[tuning.protocol.notna()].rename(columns={"commit": "git_commit"})
    tuned = (ROOT / "configs" / "tuned").glob("*/*/*.yaml")
    provenance = [yaml.safe_load(p.read_text()).get("provenance") or {} for p in tuned]
    picks = pd.DataFrame(
        [
            {"protocol": p["protocol"]["version"], "protocol_hash": p["protocol"]["hash"], "git_commit": p["commit"]}
            for p in provenance
            if p.get("protocol")
        ]
    )
    rows = pd.concat([frame[["protocol", "protocol_hash", "git_commit"]] for frame in (record, tuning, picks)])
    reviewed = protocol.reviewed(versions.values())
    for version, part in rows.groupby(rows.protocol.astype(int)):
        assert set(part.protocol_hash) == {versions[version].hash}, version
        protocol.check_unchanged(versions[version], set(part.git_commit), reviewed)
    protocol.check_unchanged(versions[max(versions)], [None], reviewed)  # the working tree: the current version


def test_the_one_reviewed_change_is_v6s_retune():
    """GPT-2 HAM's search space, from v4's registration (whose tunings v6 takes) to v6's: refused
    without it, forgiven with it, between v6's registration and a run made before it."""
    versions = protocol.versions("embedded")
    blobs = [
        subprocess.check_output(
            ["git", "rev-parse", f"{v.registration}:configs/hparams_search/gpt2_ham.yaml"], cwd=ROOT
        )
        .decode()
        .strip()
        for v in (versions[3], versions[5])
    ]
    reviewed = protocol.reviewed(versions)
    assert reviewed == {("configs/hparams_search/gpt2_ham.yaml", frozenset(blobs))}
    v5_vit_run = "d39f59f3a7a271cfacd2d42c558f82860b33015e"  # before v6's file: its named files alone compared
    protocol.check_unchanged(versions[5], [v5_vit_run], reviewed)
    with pytest.raises(protocol.ProtocolError, match=r"v6 changed since its registration .*gpt2_ham.yaml"):
        protocol.check_unchanged(versions[5], [v5_vit_run])


def test_a_version_restated_over_the_one_it_extends_is_the_version_it_registered():
    """v4-v6 were registered whole and now hold only what differs from the version they extend:
    once merged, each is the file its registering commit added (its `hash` label aside)."""
    for version in protocol.versions("embedded")[3:]:
        registered = subprocess.check_output(
            ["git", "show", f"{version.registration}:{version.path.relative_to(ROOT)}"], cwd=ROOT
        )
        assert "extends" in yaml.safe_load(version.path.read_text())
        assert {k: v for k, v in version.spec.items() if k != "hash"} == yaml.safe_load(registered)


def test_the_record_holds_the_600_and_300_update_gpt2_runs_as_their_versions():
    record = read_record([ROOT / "results" / "embedded" / "runs.csv"])
    gpt2 = record[record.pipeline == "gpt2"].drop_duplicates(["protocol", "run"])
    counts = gpt2.groupby("protocol").run.nunique()
    assert counts[1] == 40 and counts[2] == 40
    assert set(gpt2[gpt2.protocol == 1].git_commit) != set(gpt2[gpt2.protocol == 2].git_commit)


def test_the_confirmatory_version_reports_on_fresh_seeds():
    """The exploratory versions reported on seeds 0-9, whose results have been read; the
    confirmatory ones (v3-v6) on 10-19."""
    jobs = study.study_jobs(study.presets_of("embedded"))
    assert {j.seed for j in jobs} == set(range(10, 20))
    record = read_record([ROOT / "results" / "embedded" / "runs.csv"])
    status = {v.version: v.status for v in protocol.versions("embedded")}
    exploratory = record.protocol.map(status) == "exploratory"
    assert set(record[exploratory].seed) <= set(range(10)) and set(record[~exploratory].seed) <= set(range(10, 20))


def test_a_changed_file_is_a_new_version(repo):
    (version,) = _register(repo, 1, SPEC.format(files="recipe.yaml"))
    assert version.hash == version.registration == _git(repo, "rev-parse", "HEAD")
    protocol.check_unchanged(version, [None, "HEAD"])
    (repo / "recipe.yaml").write_text("steps: 300\n")
    with pytest.raises(
        protocol.ProtocolError, match="v1 changed since its registration .*the working tree: recipe.yaml"
    ):
        protocol.check_unchanged(version, [None])
    _git(repo, "commit", "-qam", "a shorter recipe")
    with pytest.raises(protocol.ProtocolError, match="recipe.yaml; restore them .* or register the change as a new"):
        protocol.check_unchanged(version, ["HEAD"])
    _git(repo, "revert", "--no-edit", "HEAD")
    (repo / "protocols" / "demo" / "v1.yaml").write_text("version: 1\n" + SPEC.format(files="recipe.yaml, claims.md"))
    (repo / "claims.md").write_text("more\n")
    with pytest.raises(protocol.ProtocolError, match="the working tree: protocols/demo/v1.yaml"):
        protocol.check_unchanged(protocol.load(repo / "protocols" / "demo" / "v1.yaml", repo), [None])
    with pytest.raises(protocol.ProtocolError, match="3f: not a commit of this repository"):
        protocol.check_unchanged(version, ["3f"])


def test_a_version_is_registered_by_its_commit(repo):
    (repo / "protocols" / "demo" / "v1.yaml").write_text("version: 1\n" + SPEC.format(files="recipe.yaml"))
    (version,) = protocol.versions("demo", repo)
    assert version.registration is None
    with pytest.raises(protocol.ProtocolError, match="v1.yaml is not committed: commit it"):
        protocol.check_unchanged(version, [None])


def test_a_version_that_declares_edges_only_runs_at_the_earlier_versions_tunings(repo):
    """v5 = v4 + declared edges: the same tunings, not redone; one that changes more must tune."""
    tuning = "tuning: {trials: {vit: 16}, declared_edges: []}\n"
    _register(repo, 1, SPEC.format(files="recipe.yaml") + tuning)
    edges = "extends: 1\ntunings_from: 1\ntuning: {declared_edges: [ham optimizer.alpha at the lower edge]}\n"
    versions = _register(repo, 2, "why: edges\n" + edges)
    assert protocol.tuned_under(versions[1], versions) is versions[0]
    assert protocol.tuned_under(versions[0], versions) is versions[0]
    assert versions[1].declared_edges == ["ham optimizer.alpha at the lower edge"] and versions[1].why == "edges"
    (repo / "protocols" / "demo" / "v2.yaml").write_text(
        "version: 2\nwhy: more\n" + edges.replace("}\n", ", trials: {vit: 8}}\n")
    )
    with pytest.raises(protocol.ProtocolError, match="differs from it in more than its declared edges"):
        protocol.tuned_under(protocol.versions("demo", repo)[1], protocol.versions("demo", repo))
    (repo / "protocols" / "demo" / "v2.yaml").write_text("version: 2\nwhy: x\nextends: 1\ntunings_from: 3\n")
    with pytest.raises(protocol.ProtocolError, match="v2.yaml: tunings_from: 3 names no earlier version"):
        protocol.tuned_under(protocol.versions("demo", repo)[1], protocol.versions("demo", repo))


def test_a_version_that_retunes_an_arm_may_change_its_search_space_alone(repo):
    """v2 takes v1's tunings but for GPT-2's HAM, whose search space it widens: v1's files may
    differ from v1's registration there alone (protocol.reviewed), not in another arm's."""
    spaces = repo / "configs" / "hparams_search"
    spaces.mkdir(parents=True)
    for arm in ("ham", "adamw"):
        (spaces / f"gpt2_{arm}.yaml").write_text("alpha: [1, 10]\n")
    files = "configs/hparams_search/gpt2_ham.yaml, configs/hparams_search/gpt2_adamw.yaml"
    _register(repo, 1, SPEC.format(files=files))
    (spaces / "gpt2_ham.yaml").write_text("alpha: [1, 100]\n")
    versions = _register(repo, 2, "why: wider\nextends: 1\ntunings_from: 1\nretune: [gpt2 ham]\n")
    reviewed = protocol.reviewed(versions)
    protocol.check_unchanged(versions[0], [None], reviewed)
    with pytest.raises(protocol.ProtocolError, match="v1 changed since its registration .*gpt2_ham.yaml"):
        protocol.check_unchanged(versions[0], [None])
    (spaces / "gpt2_adamw.yaml").write_text("alpha: [1, 100]\n")
    with pytest.raises(protocol.ProtocolError, match=r"the working tree: configs/hparams_search/gpt2_adamw.yaml;"):
        protocol.check_unchanged(versions[0], [None], reviewed)
    (spaces / "gpt2_ham.yaml").write_text("alpha: [1, 1000]\n")  # the reviewed file changed again
    with pytest.raises(protocol.ProtocolError, match="v2 changed since its registration .*gpt2_ham.yaml"):
        protocol.check_unchanged(versions[1], [None], reviewed)


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
    bad.write_text("study: demo\nversion: 2\nstatus: final\nwhy: x\nclaims: c.yaml\n")
    with pytest.raises(protocol.ProtocolError, match="status 'final' is not one of confirmatory, exploratory"):
        protocol.load(bad, tmp_path)
    bad.write_text("study: demo\nversion: 2\nstatus: exploratory\nwhy: x\nclaims: c.yaml\n")
    with pytest.raises(protocol.ProtocolError, match="v2.yaml names c.yaml, which does not exist: restore it"):
        protocol.load(bad, tmp_path)
    bad.write_text("extends: 1\nversion: 2\nwhy: x\n")
    with pytest.raises(protocol.ProtocolError, match="protocols/demo/v1.yaml does not exist"):
        protocol.load(bad, tmp_path)
    with pytest.raises(protocol.ProtocolError, match="no protocol for study other"):
        protocol.versions("other", tmp_path)
