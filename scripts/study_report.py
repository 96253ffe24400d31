"""A study's results folder: tables, paired comparisons, the paper's claims judged, the power
table, the README's headline include and the figures (analysis.report).

    python scripts/study_report.py results/embedded/runs.csv --out report   # from the committed record
    python scripts/study_report.py outputs/embedded --out report           # from run folders (also writes runs.csv)

Reads the runs measured on analysis/claims.yaml's split (`test`) unless --split says otherwise.
Its README.md is this report's; `scripts/embedded_study.py --report-only` rewrites a study's own
folder (results/embedded) with the study's README (its commands and cost).
"""

import sys

from analysis.report import main

if __name__ == "__main__":
    main(sys.argv[1:], study=True)
