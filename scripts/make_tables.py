"""`horst-tables` as a script: horst_sparse.analysis.report.tables_main (its --help says what it does)."""

from horst_sparse.analysis.report import tables_main

if __name__ == "__main__":
    tables_main()
