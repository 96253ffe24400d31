"""`horst-sparse`: the one command over the study's tools, one subcommand each (`horst-sparse <command> --help`).

    horst-sparse config vit experiment=smoke_vit optimizer=horst    # a run's values and the file each comes from
    horst-sparse plan train_vit.py -m +study=deit_table               # jobs, resources, GPU-hours; nothing submitted
    horst-sparse tune vit adamw --trials 16                           # tune an arm on the validation split
    horst-sparse study --report-only                                  # the embedded study's report

The training runs themselves are the entry points, `python train_vit.py` and `python train_gpt2.py`.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

# name: (the function that runs it, "module:function"; what it does, one line for the list)
COMMANDS = {
    "config": ("horst_sparse.cli:config_main", "a run's composed config, each value with the file it comes from"),
    "plan": ("horst_sparse.plan:main", "a sweep's jobs, resources and GPU-hours, checked; nothing submitted"),
    "tune": ("horst_sparse.tune:main", "tune one arm on the validation split and write its pick"),
    "study": ("horst_sparse.study.run:main", "the embedded study, the demo, their reports and checks"),
    "tables": ("horst_sparse.analysis.report:tables_main", "tables and figures of any sweeps' runs"),
    "study-report": ("horst_sparse.analysis.report:study_report_main", "a study's report: tables, claims, figures"),
    "sweep-table": ("horst_sparse.analysis.sweep:main", "a sweep's scores by setting (alpha x beta, ...)"),
    "tuning-curves": ("horst_sparse.analysis.tuning_curves:main", "tuning curves with confidence bands"),
    "status": ("hydra_plugins.horst_slurm.status:main", "a SLURM sweep's cells and the line that continues it"),
    "export": ("horst_sparse.training.export:main", "a run's model for transformers or timm, with a model card"),
    "sizing": (
        "horst_sparse.analysis.sizing:main",
        "the seeds each endpoint needs for the smallest effect that matters",
    ),
    "fingerprint": ("horst_sparse.fingerprint:main", "the bits of a short run of each pipeline"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    return (__doc__ or "").split("\n\n")[0] + "\n\ncommands:\n" + "\n".join(lines) + "\n"


def typed(command: str, argv: Sequence[str] = ()) -> str:
    """`horst-sparse <command> <argv>` as its user typed it (a pick's `made_by`, the planner's last line):
    `python -m horst_sparse.cli ...` where the process is this module, else the installed command (also
    where code calls a command's main)."""
    program = ["python", "-m", "horst_sparse.cli"] if Path(sys.argv[0]).resolve() == Path(__file__).resolve() else []
    return shlex.join([*(program or ["horst-sparse"]), command, *argv])


def subcommand(command: str, doc: str | None) -> argparse.ArgumentParser:
    """A subcommand's parser: `doc`'s first paragraph is its description, the rest (examples) its epilog."""
    first, _, rest = (doc or "").partition("\n\n")
    formatter = argparse.RawDescriptionHelpFormatter
    return argparse.ArgumentParser(prog=typed(command), description=first, epilog=rest, formatter_class=formatter)


def main(argv: Sequence[str] | None = None) -> int | None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"did you mean {close[0]}?" if close else f"the commands are {', '.join(COMMANDS)}"
        print(f"error: horst-sparse has no command {name!r}; {hint}", file=sys.stderr)
        return 2
    module, function = COMMANDS[name][0].split(":")
    return getattr(importlib.import_module(module), function)(rest)


def config_main(argv: Sequence[str] | None = None) -> int:
    """`horst-sparse config`: the config a run of PIPELINE composes with the OVERRIDES, one line a value,
    with the file under configs/ that set it last (Hydra's merge order: the defaults list, then the
    command line). A value copied from another key (`${hparams.base_lr}`) names the file of the value
    it copies, the interpolation that led there and the key it reached (tuned.<arm>.base_lr).

        horst-sparse config vit                                     # the embedded default
        horst-sparse config gpt2 experiment=smoke_gpt2 optimizer=ham train.lr
        horst-sparse config vit optimizer=horst --all               # with the table of tuned values
    """
    from horst_sparse.compose import ComposeError, where_from, where_from_text
    from horst_sparse.pipeline import UnknownPipeline, get, names
    from horst_sparse.training.presets import misspelt_key, unknown_option

    parser = subcommand("config", config_main.__doc__)
    parser.add_argument("pipeline", help=" | ".join(names()))
    parser.add_argument(
        "overrides", nargs="*", help="as on the entry point's command line; a bare key (train.lr) picks what is shown"
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="also the `tuned` table the run's values are copied from (and `hparams`, its section)",
    )
    args = parser.parse_args(argv)
    overrides = [o for o in args.overrides if "=" in o]
    shown = [o for o in args.overrides if "=" not in o]
    try:
        pipeline = get(args.pipeline)
        pipeline.configs.register()
        if problem := misspelt_key(pipeline.name, overrides) or unknown_option(overrides):
            raise ComposeError(problem.removeprefix("error: "))
        rows = where_from(pipeline, overrides)
    except (UnknownPipeline, ComposeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if shown:
        rows = [r for r in rows if any(r[0] == key or r[0].startswith(key + ".") for key in shown)]
    elif not args.all:
        rows = [r for r in rows if not r[0].startswith(("tuned.", "hparams."))]
    if not rows:
        print(f"error: the config has no key {', '.join(shown)}", file=sys.stderr)
        return 2
    print(where_from_text(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
