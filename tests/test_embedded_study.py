"""horst_sparse.study.run and horst-sparse study: the study's jobs composed from its presets and
arms, multiruns for what is missing, stale runs and runs of other code refused, a dirty tree
refused, the "add an arm" recipe, and a tiny study run, resumed from its record, and refused
when its settings change."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ROOT

from horst_sparse.analysis import claims, report, runs
from horst_sparse.study import budget
from horst_sparse.study import report as study_report
from horst_sparse.study import run as study
from horst_sparse.study.jobs import Job

TINY_VIT = [
    "train.epochs=5",
    "train.warmup_epochs=1",
    "train.batch_size=256",
    "acdc.dense_warmup=1",
    "acdc.compressed=1",
    "acdc.decompressed=1",
    "acdc.final_decompressed=1",
    "acdc.final_compressed=2",
]


@pytest.fixture(scope="module")
def demo_jobs() -> list[Job]:
    return study.study_jobs(["demo_vit", "demo_gpt2"])


TWO_SEEDS = ["seed=20,21"]  # every cell of the presets at two of their reporting seeds: 31 jobs to compose, not 620


@pytest.fixture(scope="module")
def embedded_jobs() -> list[Job]:
    return study.study_jobs(study.presets_of("embedded"), TWO_SEEDS)


def test_the_demo_is_every_arm_x_sparsity_x_seed_with_its_label(demo_jobs):
    vit = [j for j in demo_jobs if j.pipeline == "vit"]
    assert len(vit) == 9 and len(demo_jobs) == 12
    assert {j.config["data"]["name"] for j in vit} == {"mnist1d"}  # the study's benchmark, at its tuned values
    job = next(j for j in vit if j.overrides == ("experiment=horst", "acdc.sparsity=0.9"))
    assert job.run == "outputs/demo/vit/horst/s0.9/seed0"
    assert (job.config["arm"], job.config["optimizer"]["name"], job.config["eval_split"]) == ("horst", "horst", "test")
    assert len({j.signature for j in vit}) == 3  # a cell is an arm: sparsity and seed tell its runs apart


def test_the_control_decays_as_hard_as_the_horst_it_controls(job_configs, compose):
    """adamw_decay shrinks a weight per step as much as the HORST it controls, at AdamW's own lr:
    lr_a wd = lr_h (wd_h + beta_h), from both arms' tuned values; retuning HORST's beta moves the
    control with it (no copied number)."""
    for pipeline, lr in (("vit", "base_lr"), ("gpt2", "lr")):
        control, horst, adamw = (job_configs[(pipeline, arm)] for arm in ("adamw_decay", "horst", "adamw"))
        shrink = horst["train"][lr] * (horst["optimizer"]["weight_decay"] + horst["optimizer"]["beta"])
        assert control["train"][lr] * control["optimizer"]["weight_decay"] == pytest.approx(shrink)
        assert control["train"][lr] == adamw["train"][lr]
        assert control["optimizer"]["name"] == "adamw" and control["arm"] == "adamw_decay"
    moved = compose("vit", ["experiment=adamw_decay", "tuned.horst.beta=0.5", "tuned.horst.base_lr=1e-3"])
    horst = job_configs[("vit", "horst")]
    assert moved["optimizer"]["weight_decay"] == pytest.approx(
        (horst["optimizer"]["weight_decay"] + 0.5) * 1e-3 / moved["train"]["base_lr"]
    )


def test_multiruns_are_the_whole_sweep_or_the_missing_cells(demo_jobs):
    assert study.multiruns(demo_jobs) == [("demo_vit", []), ("demo_gpt2", [])]  # the study's order
    missing = [j for j in demo_jobs if j.pipeline == "vit" and "experiment=ham" in j.overrides][:2]
    assert study.multiruns(missing) == [
        ("demo_vit", ["experiment=ham", "acdc.sparsity=0.7", "seed=0"]),
        ("demo_vit", ["experiment=ham", "acdc.sparsity=0.8", "seed=0"]),
    ]
    assert study.command("demo_vit", ["experiment=ham", "seed=0"], ["experiment=adamw", "train.epochs=5"]) == [
        "python",
        "train_vit.py",
        "-m",
        "+study=demo_vit",
        "experiment=ham",
        "seed=0",
        "train.epochs=5",
    ]


def test_arms_not_tuned_alike_are_refused():
    """The digits recipe's picks were made before horst-sparse tune (no provenance): a study on it is
    refused, naming the arm, until each arm is tuned with the same budget."""
    from horst_sparse.study.budget import BudgetError

    with pytest.raises(BudgetError, match=r"arm \w+ was not tuned by horst-sparse tune"):
        study.check_budgets(study.study_jobs(["demo_vit"], ["vit_recipe=digits"]))


def test_the_embedded_study_is_its_presets_and_tunes_what_its_budget_asks_for(embedded_jobs):
    """The presets of protocol v7: embedded_vit (tuned arms x 70/80/90 %), its controls' part at 90 %
    (a preset over it) and GPT-2's four tuned arms and its mirror-off control, fresh reporting seeds
    (ViT 20-59, GPT-2 20-39), on the fast engine, GPT-2 measured during training too (the matched
    curve); the protocol tunes every arm anew with its budget (search, second stage, reruns of the
    best at 4 more seeds, the stability guard) and asks for no arm whose pick it has."""
    from horst_sparse.study import protocol

    jobs = embedded_jobs
    by_preset = {
        p: [j for j in jobs if j.preset == p] for p in ("embedded_vit", "embedded_vit_controls", "embedded_gpt2")
    }
    assert {p: len(js) for p, js in by_preset.items()} == {
        "embedded_vit": 3 * 3 * 2,
        "embedded_vit_controls": 4 * 2,
        "embedded_gpt2": 5 * 2,
    }
    seeds = {p: study.preset_config(p)["hydra"]["sweeper"]["params"]["seed"] for p in ("embedded_vit", "embedded_gpt2")}
    assert seeds == {"embedded_vit": "range(20,60)", "embedded_gpt2": "range(20,40)"}  # the controls: embedded_vit's
    for preset, arm in (("embedded_vit_controls", "horst_mirror_off"), ("embedded_gpt2", "horst_mirror_off")):
        mirror_off = next(j.config for j in by_preset[preset] if j.config["arm"] == arm)
        base = "embedded_vit" if preset == "embedded_vit_controls" else preset
        horst = next(j.config for j in by_preset[base] if j.config["arm"] == "horst")
        assert (mirror_off["optimizer"]["alpha"], mirror_off["optimizer"]["beta"]) == (0.0, 0.0)  # AdamW, bit for bit
        assert mirror_off["train"] == horst["train"]
        assert mirror_off["optimizer"]["weight_decay"] == horst["optimizer"]["weight_decay"]
    controls = by_preset["embedded_vit_controls"]
    assert {j.config["arm"] for j in controls} == {"horst_beta0", "adamw_decay", "horst_sm", "horst_mirror_off"}
    assert {j.config["acdc"]["sparsity"] for j in controls} == {0.9} and {j.seed for j in jobs} == {20, 21}
    assert {(j.config["data"]["name"], j.config["eval_split"], j.recipe) for j in controls} == {
        ("mnist1d", "test", "mnist1d")
    }
    assert {j.config["engine"] for j in jobs} == {"fast"}
    assert {tuple(j.config["prune"]["at_steps"]) for j in by_preset["embedded_gpt2"]} == {(150, 300, 450)}
    versions = protocol.versions("embedded")
    current = versions[-1]
    assert protocol.tuned_under(current, versions) is current and not current.retuned  # its own tunings
    arms = {(j.pipeline, j.config["tuned_as"]) for j in jobs}  # every set of tuned values the runs read: arms, counted
    assert {a for p, a in arms if p == "gpt2"} == {"adamw", "ham", "horst", "horst_prunable"}
    assert {a for p, a in arms if p == "vit"} == {"adamw", "ham", "horst"}

    def picked(made):
        """The jobs with every arm's pick made under the given protocol version ({(pipeline, arm): version})."""
        return [
            Job(
                **{
                    **j.__dict__,
                    "config": {
                        **j.config,
                        "tuned": {
                            a: {"provenance": {"protocol": {"version": made[(j.pipeline, a)]}}}
                            for p, a in arms
                            if p == j.pipeline
                        },
                    },
                }
            )  # fmt: skip
            for j in jobs
        ]

    lines = study.tunings(current, picked({arm: 6 for arm in arms}), versions)
    assert sorted((line[2], line[3]) for line in lines) == sorted(arms)  # every arm tuned anew under v7
    budget = current.tuning
    line = next(line for line in lines if line[2:4] == ["gpt2", "ham"])
    assert line[:2] == ["horst-sparse", "tune"] and line[4:14] == [
        "--trials", str(budget["trials"]["gpt2"]), "--top-k", str(budget["top_k"]["gpt2"]),
        "--rerun-seeds", str(budget["rerun_seeds"]), "--refine-trials", str(budget["refine_trials"]["gpt2"]),
        "--stability-radius", str(budget["stability_radius"]),
    ]  # fmt: skip
    assert line[14:18] == [
        "--protocol", f"protocols/embedded/v{current.version}.yaml",
        "--sweep-dir", f"outputs/embedded/v{current.version}/tuning/gpt2/ham",
    ]  # fmt: skip
    assert "gpt2_recipe=pydoc" in line and "engine=fast" in line
    done = {arm: current.version for arm in arms}
    assert study.tunings(current, picked({**done, ("gpt2", "ham"): 6}), versions) == [
        next(line for line in lines if line[2:4] == ["gpt2", "ham"])
    ]
    assert study.tunings(current, picked(done), versions) == []


def test_a_cells_jobs_are_its_config_resolved_at_each_seed():
    """study_jobs resolves a cell whole at two seeds and, at the others, only the keys in which
    those two differ: every job is what resolving the config at its seed gives, and no two share
    a dict that differs between them."""
    from omegaconf import OmegaConf

    from horst_sparse.study.jobs import _resolved

    config = OmegaConf.create(
        {"seed": 0, "data": {"seed": "${seed}", "name": "x"}, "tag": "run${seed}", "lr": 0.1, "hydra": {"a": 1}}
    )
    jobs = [dict(job) for job in _resolved(config, [4, 5, 6, 7])]
    assert [(j["seed"], j["data"]["seed"], j["tag"]) for j in jobs] == [(s, s, f"run{s}") for s in (4, 5, 6, 7)]
    assert all(
        j == {"seed": s, "data": {"seed": s, "name": "x"}, "tag": f"run{s}", "lr": 0.1}
        for j, s in zip(jobs, (4, 5, 6, 7))
    )
    assert jobs[2]["data"] is not jobs[0]["data"] and jobs[3]["data"] is not jobs[2]["data"]
    assert list(_resolved(OmegaConf.create({"seed": 0, "hydra": {}}), [3])) == [{"seed": 3}]


def test_a_study_whose_newest_version_names_no_presets_is_refused(monkeypatch):
    """A version recorded after the fact (v1: the commit of its runs, no presets) cannot be run."""
    from horst_sparse.study import protocol

    first = protocol.versions("embedded")[:1]
    monkeypatch.setattr(protocol, "versions", lambda study: first)
    with pytest.raises(study.StudyError, match="v1.yaml names no presets: the study has no version to run"):
        study.run_study("embedded", report_only=True)


def test_the_cost_table_is_measured_from_the_runs(embedded_jobs):
    """The study's README states what it cost from the record: wall time a run, the tuning budget,
    the machine and threads the runs recorded, and what the whole takes at that rate."""
    import pandas as pd

    jobs = embedded_jobs
    vit = [j for j in jobs if j.pipeline == "vit"]
    frame = pd.DataFrame(
        [
            {
                "run": j.run,
                "pipeline": "vit",
                "wall_time_s": 40.0 + i % 3,
                "host": "node7",
                "cpu": "Xeon",
                "cpu_capability": "AVX512",
                "cpu_threads": 1,
            }
            for i, j in enumerate(vit[:20])
        ]
    )
    text = study_report.cost_table(frame, jobs)
    row = next(line for line in text.splitlines() if line.startswith("| vit "))
    tuning = sum(  # every search trial and rerun, one run per cell (the ViT's: one per reported sparsity)
        budget.tuning_runs(vit[0].config["tuned"][o].get("provenance") or {}) for o in ("adamw", "ham", "horst")
    )
    expected_hours = (len(vit) + tuning) * 41.0 / 2 / 3600  # two runs side by side
    assert row.split(" | ")[1:4] == [f"20 of {len(vit)}", "41", f"{20 * 41.0 / 3600:.1f}"]
    assert row.rstrip(" |").endswith(f"{expected_hours:.1f}")
    gpt2 = sum(j.pipeline == "gpt2" for j in jobs)
    assert (
        f"| gpt2 | 0 of {gpt2} | – |" in text and "Machine: host node7 (Xeon, AVX512), 1 torch thread(s) a run." in text
    )


def test_a_stale_run_is_named_with_the_keys_that_differ(tmp_path, demo_jobs, write_run):
    job = demo_jobs[0]
    old = json.loads(json.dumps(job.config))
    old["train"]["epochs"] = 7
    write_run(tmp_path / "run", old, 0.9)
    frame = runs.scan([tmp_path]).frame.assign(run=job.run)
    lines = study.stale([job], frame, {job.run: tmp_path / "run"})
    assert lines == [f"{job.run}: train.epochs: 7 -> {job.config['train']['epochs']}"]
    assert study.stale([job], frame.assign(signature=job.signature), {}) == []


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def test_provenance_refuses_dirty_trees_and_runs_of_other_code(tmp_path):
    repo = tmp_path / "repo"
    (repo / "horst").mkdir(parents=True)
    (repo / "horst" / "step.py").write_text("a = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "horst" / "step.py").write_text("a = 2\n")
    with pytest.raises(study.StudyError, match="uncommitted changes .*horst/step.py"):
        study.check_clean(repo)
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "b")
    second = _git(repo, "rev-parse", "HEAD")
    (repo / "README.md").write_text("docs only\n")
    (repo / "results").mkdir()
    (repo / "results" / "runs.csv").write_text("a study's record, written while it runs\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "README.md")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    study.check_clean(repo)  # results/ is the study's own output
    study.check_provenance([second, _git(repo, "rev-parse", "HEAD")], repo)  # same code: a README changed
    with pytest.raises(
        study.StudyError, match=rf"{first[:12]}: its code differs from HEAD's in 1 file\(s\): horst/step.py"
    ):
        study.check_provenance([first, second], repo)
    (repo / "configs" / "tuned" / "gpt2").mkdir(parents=True)
    (repo / "configs" / "tuned" / "gpt2" / "pydoc.yaml").write_text("adamw: {lr: 1}\n")  # written by a stopped study
    resume = study.picks_being_written([["horst-sparse", "tune", "gpt2", "horst"]])
    study.check_clean(repo, allowed=resume)  # it tunes gpt2's next arm beside the picks it wrote
    with pytest.raises(study.StudyError, match="uncommitted changes .*configs/tuned/"):
        study.check_clean(repo, allowed=study.picks_being_written([]))  # tuned: its runs need them committed
    with pytest.raises(study.StudyError, match="uncommitted changes .*configs/tuned/"):
        study.check_clean(repo, allowed=study.picks_being_written([["horst-sparse", "tune", "vit", "ham"]]))
    shutil.rmtree(repo / "configs")
    with pytest.raises(study.StudyError, match="-dirty: ran from a tree with uncommitted changes"):
        study.check_provenance([second + "-dirty"], repo)
    with pytest.raises(study.StudyError, match="0000000000: not a commit of this repository"):
        study.check_provenance(["0" * 40], repo)
    # a pick committed later (configs/tuned/) is the signature check's: runs that read it are stale
    (repo / "configs" / "tuned").mkdir(parents=True)
    (repo / "configs" / "tuned" / "gpt2.yaml").write_text("lr: 1.0e-3\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "configs")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "d")
    study.check_provenance([second], repo)
    # a reviewed change (exact blobs before and after: protocol.reviewed) is forgiven; the file changed again is not
    (repo / "horst" / "step.py").write_text("a = 2  # a comment\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "e")
    reviewed = {("horst/step.py", frozenset(_git(repo, "rev-parse", f"{c}:horst/step.py") for c in (second, "HEAD")))}
    study.check_provenance([second], repo, reviewed)
    with pytest.raises(study.StudyError, match="differs from HEAD's in 1 file"):
        study.check_provenance([first], repo, reviewed)  # a = 1 -> a = 2 was not reviewed
    (repo / "horst" / "step.py").write_text("a = 3\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "f")
    with pytest.raises(study.StudyError, match="differs from HEAD's in 1 file"):
        study.check_provenance([second], repo, reviewed)


def test_add_an_arm_recipe(tmp_path, write_run):
    """docs/design.md §5's recipe, followed: (1) an experiment configs/experiment/<name>.yaml that
    chooses the optimizer, sets its values and records `arm: <name>`; (2) its name in the preset's `experiment`;
    (3) where it is to be compared, a line in horst_sparse/analysis/claims.yaml's `comparisons`."""
    configs = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", configs)
    (configs / "experiment" / "horst_alpha1.yaml").write_text(
        "# @package _global_\n# HORST at alpha 1.\ndefaults:\n  - override /optimizer: horst\n\n"
        "arm: horst_alpha1\noptimizer:\n  alpha: 1.0\n"
    )
    preset = configs / "study" / "demo_vit.yaml"
    spec = yaml.safe_load(preset.read_text())
    spec["hydra"]["sweeper"]["params"]["experiment"] += ",horst_alpha1"
    preset.write_text("# @package _global_\n" + yaml.safe_dump(spec, sort_keys=False))
    rules = claims.load_rules()
    rules["comparisons"]["vit"].append(["horst_alpha1", "horst"])

    jobs = [j for j in study.study_jobs(["demo_vit"], configs=configs) if "acdc.sparsity=0.9" in j.overrides]
    new = next(j for j in jobs if j.config["arm"] == "horst_alpha1")
    assert new.run == "outputs/demo/vit/horst_alpha1/s0.9/seed0" and new.config["optimizer"]["alpha"] == 1.0
    for job, top1 in ((new, 0.93), (next(j for j in jobs if j.config["arm"] == "horst"), 0.95)):
        write_run(tmp_path / "runs" / job.run, job.config, top1)
    frame = runs.scan([tmp_path / "runs"], arms=configs / "experiment").frame
    assert set(frame.arm) == {"horst_alpha1", "horst"}
    paired = report.comparisons(frame, rules)
    assert paired[paired["first"] == "horst_alpha1"].estimate.iloc[0] == pytest.approx(-2.0)


@pytest.mark.slow  # ~2-4 min: two tiny ViT runs in a clean clone, through the command line
def test_a_tiny_study_runs_resumes_from_its_record_and_refuses_stale_runs(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {
        "PYTHONPATH": str(clone),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
        "PATH": "/usr/bin:/bin",
    }
    argv = [
        sys.executable,
        "-m",
        "horst_sparse.cli",
        "study",
        "--demo",
        "--pipeline",
        "vit",
        "experiment=adamw,horst",
        "acdc.sparsity=0.9",
        *TINY_VIT,
    ]

    def study_cli(*more: str) -> subprocess.CompletedProcess:
        return subprocess.run([*argv, *more], cwd=clone, env=env, capture_output=True, text=True, timeout=900)

    reference = clone / "results" / "demo" / "runs.csv"
    committed = reference.read_text()
    first = study_cli()  # make demo: trains into outputs/demo, compares with the committed reference
    assert "2 of 2 runs to do" in first.stdout and "+study=demo_vit" in first.stdout
    record = clone / "outputs" / "demo" / "runs.csv"
    frame = runs.read_record([record])
    assert set(frame.run) == {"outputs/demo/vit/adamw/s0.9/seed0", "outputs/demo/vit/horst/s0.9/seed0"}
    assert set(frame.eval_split) == {"test"} and not frame.git_commit.str.endswith("-dirty").any()
    assert "## Your runs beside the committed reference (results/demo/runs.csv)" in first.stdout
    assert "| vit/horst/s0.9/seed0 | top1 90 % |" in first.stdout  # at 5 epochs, not the reference's recipe:
    assert first.returncode == 1 and "numbers identical, bit for bit" in first.stdout  # they differ
    assert (
        reference.read_text() == committed
        and not subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
    )
    written = record.read_text()
    study_cli("--out", "results/demo")  # make demo-reference: the same runs, written as the reference
    rewritten, before = runs.read_record([reference]), runs.read_record([io.StringIO(committed)])
    assert rewritten[rewritten.pipeline == "vit"].run.tolist() == frame.run.tolist()
    gpt2 = rewritten[rewritten.pipeline == "gpt2"].reset_index(drop=True)  # the pipeline not run: kept as it was
    pd.testing.assert_frame_equal(gpt2, before[before.pipeline == "gpt2"].reset_index(drop=True))
    checked = study_cli("--check")  # make check-results: horst at 90 %, seed 0, rerun into a scratch folder
    assert checked.returncode == 0, checked.stdout + checked.stderr[-2000:]
    assert "## vit: experiment=horst acdc.sparsity=0.9, seed(s) [0] rerun; check: bit for bit" in checked.stdout
    assert "top1 acdc unstructured 0.9: committed" in checked.stdout and "reproducible mode" in checked.stdout
    assert "the record reproduces bit for bit" in checked.stdout
    # a record made outside the reproducible mode is judged against its seeds' spread instead
    exact = reference.read_text()
    runs.read_record([reference]).assign(reproducible_cpu=False).to_csv(reference, index=False)
    spread = study_cli("--check")
    assert spread.returncode == 0, spread.stdout + spread.stderr[-2000:]
    assert "check: within the committed spread of 1 seeds" in spread.stdout and "rank test p = 1" in spread.stdout
    reference.write_text(exact)

    shutil.rmtree(
        clone / "outputs" / "demo" / "vit"
    )  # run folders need not outlive the machine: the record is the record
    again = study_cli()
    assert again.returncode == 0 and "0 of 2 runs to do" in again.stdout and "2 of 2 numbers identical" in again.stdout
    assert record.read_text() == written

    stale = study_cli("train.epochs=6", "acdc.final_compressed=3")
    assert stale.returncode == 1 and "2 finished run(s) were made with other settings" in stale.stderr

    (clone / "horst" / "__init__.py").write_text((clone / "horst" / "__init__.py").read_text() + "\n# edited\n")
    dirty = study_cli()
    assert dirty.returncode == 1 and "the working tree has uncommitted changes" in dirty.stderr
