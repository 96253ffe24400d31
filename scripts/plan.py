"""`horst-plan` as a script: horst_sparse.study.plan.main (its --help says what it does)."""

from horst_sparse.study.plan import main

if __name__ == "__main__":
    main()
