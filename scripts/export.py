"""`horst-export` as a script: horst_sparse.training.export.main (its --help says what it does)."""

import sys

from horst_sparse.training.export import main

if __name__ == "__main__":
    sys.exit(main())
