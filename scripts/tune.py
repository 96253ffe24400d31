"""Tune one arm (an optimizer under a recipe) with a fixed trial budget on the validation split,
and write the pick where the pipelines read it.

    python scripts/tune.py vit adamw                          # 16 quasi-random trials, embedded digits recipe
    python scripts/tune.py gpt2 horst --trials 32 hydra/launcher=slurm hydra.sweeper.n_jobs=32
    python scripts/tune.py vit horst vit_recipe=deit_imagenet data.root=/path/to/imagenet hydra/launcher=slurm

The search space is configs/hparams_search/<pipeline>_<optimizer>.yaml; any other argument is a
Hydra override of the runs (recipe, launcher, seed from 100 up). The pick and its provenance go
to configs/tuned/<pipeline>/<recipe>/<optimizer>.yaml, every trial to
results/tuning/<pipeline>/<recipe>/tuning.csv (docs/design.md §8). Give every arm of a
comparison the same --trials. Refuses to start from a git tree with uncommitted changes (other
arms' picks of the pipeline and results/ aside: a study tunes its arms one after another).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, like the entry points

from training.config import RunError  # noqa: E402
from training.tuning import DEFAULT_TRIALS, require_clean_tree, tune  # noqa: E402


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pipeline", choices=["vit", "gpt2"])
    parser.add_argument("optimizer", help="an optimizer with a search space: adamw, ham, horst")
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help=f"the budget (default {DEFAULT_TRIALS})")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of every trial, e.g. hydra/launcher=slurm")
    args = parser.parse_intermixed_args(argv)  # `--trials 8` before or after the overrides
    try:
        commit = require_clean_tree(tuning=(args.pipeline, args.optimizer))
        values = tune(args.pipeline, args.optimizer, trials=args.trials, overrides=args.overrides, commit=commit,
                      command=shlex.join(["python", "scripts/tune.py", *argv]))  # fmt: skip
    except RunError as error:
        sys.exit(f"error: {error}")
    pick = values["provenance"]["pick"]
    print(f"pick: trial {pick['trial']}, {values['provenance']['metric']} {pick['score']:.4g}; "
          f"written to {values['provenance']['tuning_csv']} and the arm's tuned file")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
