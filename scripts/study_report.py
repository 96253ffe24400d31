"""A study's results folder: tables, paired comparisons, the paper's claims judged, the power
table, the README's headline include and the figures (analysis.report).

    python scripts/study_report.py results/embedded/runs.csv --out results/embedded   # from the committed record
    python scripts/study_report.py outputs/embedded --out results/embedded           # from run folders (also writes runs.csv)

Reads the runs measured on analysis/claims.yaml's split (`test`) unless --split says otherwise.
"""

import sys

from analysis.report import main

if __name__ == "__main__":
    main(sys.argv[1:], study=True)
