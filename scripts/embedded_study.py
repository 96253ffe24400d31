"""`horst-study` as a script (make study, make demo): horst_sparse.study.run.main."""

from horst_sparse.study.run import main

if __name__ == "__main__":
    main()
