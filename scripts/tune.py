"""`horst-tune` as a script: horst_sparse.study.tuning.main (its --help says what it does)."""

from horst_sparse.study.tuning import main

if __name__ == "__main__":
    main()
