"""The embedded study and the demo: the Hydra multiruns of configs/study/<study>_<pipeline>.yaml,
resumable from results/<study>/runs.csv, then the results folder (analysis.study).

    python scripts/embedded_study.py                 # make study: results/embedded/
    python scripts/embedded_study.py --demo          # make demo (<= 15 min on 2 cores): trains into outputs/demo/,
                                                     # then compares with the committed results/demo/
    python scripts/embedded_study.py --demo --out results/demo   # make demo-reference: the committed reference
    python scripts/embedded_study.py --report-only   # no runs: the report of the runs done
    python scripts/embedded_study.py --check         # make check-results: rerun one cell per pipeline
    python scripts/embedded_study.py hydra/launcher=slurm   # extra overrides go to every multirun

Refuses a dirty tree, arms not tuned alike (scripts/tune.py; the embedded study), runs of other code (commits whose horst/, pruning/, training/, configs/
differ) and finished runs whose config is not what the presets now compose (stale).
"""

import argparse
import sys
from pathlib import Path

from analysis.runs import NoRunsError, read_record
from analysis.study import REPO, StudyError, check_clean, check_results, compare_with_reference, run_study
from training.config import RunError

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", action="store_true", help="the demo (configs/study/demo_*.yaml) into results/demo")
    parser.add_argument("--report-only", action="store_true", help="run nothing; report the runs done")
    parser.add_argument("--check", action="store_true", help="rerun seed 0 of one cell per pipeline, compare with runs.csv")
    parser.add_argument("--out", type=Path, help="the results folder (default: results/<study>; the demo's outputs/demo, "
                        "compared with the committed results/demo)")
    parser.add_argument("--pipeline", choices=["vit", "gpt2"], action="append", help="only this pipeline's half (repeatable)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every multirun, e.g. hydra/launcher=slurm")
    args = parser.parse_args()
    study = "demo" if args.demo else "embedded"
    pipelines = args.pipeline or ["vit", "gpt2"]
    try:
        if args.check:
            sys.exit(check_results(study, extra=args.overrides, pipelines=pipelines))
        if not args.report_only:
            check_clean()
        reference = REPO / "results" / "demo"
        out = args.out or (REPO / "outputs" / "demo" if args.demo else None)  # the demo never touches its reference
        status = run_study(study, extra=args.overrides, report_only=args.report_only, out=out, pipelines=pipelines)
        if args.demo and out.resolve() != reference.resolve():
            print(f"\nThe demo's report: {out}/README.md")
            status = max(status, compare_with_reference(read_record([out / "runs.csv"]), reference / "runs.csv"))
        sys.exit(status)
    except (StudyError, NoRunsError, RunError) as error:  # RunError: training.tuning's BudgetError
        sys.exit(f"error: {error}")
