"""Tables and figures of any runs (analysis.report), e.g. a sweep's:

    python scripts/make_tables.py multirun/vit multirun/gpt2 --out results/sweep

Every folder below the given ones with `config.yaml` and `summary.json` is a finished run;
runs that differ only in their seed and in keys that change no number
(training/no_effect.py) are the seeds of one cell. Failed and unfinished folders are listed.
"""

import sys

from analysis.report import main

if __name__ == "__main__":
    main(sys.argv[1:], study=False)
