"""`horst-sweep-table` as a script: horst_sparse.analysis.sweep.main (its --help says what it does)."""

from horst_sparse.analysis.sweep import main

if __name__ == "__main__":
    main()
