"""A study's protocol, versioned (horst_sparse/study/protocol.py, protocols/), with git as its
ledger: a version is registered by the commit that adds its file, a row is its version's where
the files the version names are as registered at the row's commit (or by a reviewed change), a
changed file is refused as a new version, and the ledger's check (horst_sparse/study/ledger.py,
`make check-results`) names every row, pick and version file that breaks this and every
confirmatory row on a seed an exploratory version reported on."""

from __future__ import annotations

import shutil
import subprocess

import pandas as pd
import pytest
import yaml
from conftest import ROOT

from horst_sparse.study import ledger, protocol
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
    assert current.status == "confirmatory" and current.presets  # runnable: it names the presets it runs
    assert study.presets_of("embedded") == sorted(current.presets)
    assert len({v.hash for v in versions}) == len(versions)
    assert protocol.tuned_under(current, versions).version <= current.version


def _record(root, *rows):
    """results/demo/runs.csv: one row per (protocol, protocol_hash, git_commit, seed)."""
    (root / "results" / "demo").mkdir(parents=True, exist_ok=True)
    columns = ["protocol", "protocol_hash", "git_commit", "seed"]
    pd.DataFrame(rows, columns=columns).to_csv(root / "results" / "demo" / "runs.csv", index=False)


def test_the_ledger_names_every_row_and_pick_not_made_at_its_versions_files(repo, monkeypatch, capsys):
    """A row of the record or a tuning, or a pick (an arm's section of a tuned file), is its
    version's where it carries the version's label and the files the version names were as
    registered at its commit. The working tree is not judged: it may move on after a version's runs
    (`horst-sparse study` refuses to run the version then, test_a_changed_file_is_a_new_version)."""
    (version,) = _register(repo, 1, SPEC.format(files="recipe.yaml"))
    made = _git(repo, "rev-parse", "HEAD")
    _record(repo, (1, version.hash, made, 10))
    (repo / "results" / "tuning" / "vit" / "digits").mkdir(parents=True)
    tuning = repo / "results" / "tuning" / "vit" / "digits" / "tuning.csv"
    pd.DataFrame({"protocol": [1, None], "protocol_hash": [version.hash, None], "commit": [made, "0ld"]}).to_csv(
        tuning, index=False
    )  # a tuning of no version (its protocol empty) is no version's row
    (repo / "configs" / "tuned" / "vit").mkdir(parents=True)
    pick = {"protocol": {"version": 1, "hash": version.hash, "file": "protocols/demo/v1.yaml"}, "commit": made}
    untuned = {"lr": 0.1, "provenance": None}
    tuned = {"adamw": untuned, "horst": {"lr": 0.01, "provenance": pick}, "lion": "${.adamw}"}
    (repo / "configs" / "tuned" / "vit" / "digits.yaml").write_text(yaml.safe_dump(tuned))
    assert len(ledger.recorded("demo", repo)) == 1  # the same label and commit, three times
    monkeypatch.setattr(ledger, "REPO", repo)
    ledger.main(["demo"])
    assert "every recorded row and pick of the demo study is its version's" in capsys.readouterr().out

    (repo / "recipe.yaml").write_text("steps: 300\n")
    _git(repo, "commit", "-qam", "a shorter recipe")
    later = _git(repo, "rev-parse", "HEAD")
    _record(repo, (1, version.hash, made, 10), (1, "0123abcd", later, 11), (2, version.hash, made, 12))
    found = ledger.problems("demo", repo)
    assert found[0] == f"v1: rows labelled 0123abcd, not the version's {version.hash}"
    assert f"demo v1 changed since its registration ({made[:12]}): {later[:12]}: recipe.yaml; restore" in found[1]
    assert found[2] == "1 row(s) of protocol v2, which protocols/demo/ lacks"
    assert len(found) == 3  # the working tree's recipe.yaml, changed since v1's runs, is no row's
    with pytest.raises(SystemExit) as stopped:
        ledger.main(["demo"])
    assert stopped.value.code == 1 and "ledger: 1 row(s) of protocol v2" in capsys.readouterr().out


def test_the_ledger_names_a_version_file_that_fixes_other_values_than_its_registration(repo):
    """A version's file may be restated (a comment, or what it shares with the version it extends
    left to `extends`), never changed in what it fixes."""
    _register(repo, 1, SPEC.format(files="recipe.yaml") + "tuning: {trials: {vit: 16}}\n")
    _register(
        repo, 2, SPEC.replace("a test", "more trials").format(files="recipe.yaml") + "tuning: {trials: {vit: 32}}\n"
    )
    restated = repo / "protocols" / "demo" / "v2.yaml"
    restated.write_text(
        "# v1 with more trials\nversion: 2\nextends: 1\nwhy: more trials\ntuning: {trials: {vit: 32}}\n"
    )
    assert ledger.version_file_problems(protocol.versions("demo", repo)) == []
    restated.write_text("version: 2\nextends: 1\nwhy: more trials\n")  # v1's 16 trials, not the 32 it registered
    (problem,) = ledger.version_file_problems(protocol.versions("demo", repo))
    assert problem.startswith("protocols/demo/v2.yaml fixes other values than its registration (")
    assert problem.endswith("-- protocols/demo/v2.yaml); a change is a new version")


def test_the_ledger_names_confirmatory_rows_on_an_exploratory_versions_seeds(repo):
    """An exploratory version's results have been read: a confirmatory one reports on other seeds."""
    _register(repo, 1, SPEC.replace("confirmatory", "exploratory").format(files="recipe.yaml"))
    versions = _register(repo, 2, SPEC.format(files="recipe.yaml"))
    record = pd.DataFrame({"protocol": [1, 1, 2], "seed": [0, 1, 10]})
    assert ledger.seed_problems(versions, record) == []
    record.loc[2, "seed"] = 1
    assert ledger.seed_problems(versions, record) == [
        "confirmatory rows on seed(s) [1], which an exploratory version reported on: use fresh seeds"
    ]


def test_a_row_made_before_its_versions_file_is_checked_on_the_files_it_names(repo):
    """A version that counts runs made before its file (an earlier version's, at the same picks)
    checks them on the files it names; the arm it retunes may be at either registered search space."""
    spaces = repo / "configs" / "hparams_search"
    spaces.mkdir(parents=True)
    for arm in ("ham", "adamw"):
        (spaces / f"gpt2_{arm}.yaml").write_text("alpha: [1, 10]\n")
    _register(
        repo, 1, SPEC.format(files="configs/hparams_search/gpt2_ham.yaml, configs/hparams_search/gpt2_adamw.yaml")
    )
    (repo / "runs.csv").write_text("v1's runs\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "v1's runs")
    run = _git(repo, "rev-parse", "HEAD")
    (spaces / "gpt2_ham.yaml").write_text("alpha: [1, 100]\n")
    versions = _register(repo, 2, "why: wider\nextends: 1\ntunings_from: 1\nretune: [gpt2 ham]\n")
    protocol.check_unchanged(versions[1], [run], protocol.reviewed(versions))
    with pytest.raises(
        protocol.ProtocolError, match=rf"v2 changed since .*: {run[:12]}: configs/hparams_search/gpt2_ham"
    ):
        protocol.check_unchanged(versions[1], [run])


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
