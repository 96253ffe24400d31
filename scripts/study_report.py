"""`horst-study-report` as a script: horst_sparse.analysis.report.study_report_main (its --help says what it does)."""

from horst_sparse.analysis.report import study_report_main

if __name__ == "__main__":
    study_report_main()
