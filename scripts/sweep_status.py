"""`horst-sweep-status` as a script: hydra_plugins.horst_slurm.status.main (its --help says what it does)."""

import sys

from hydra_plugins.horst_slurm.status import main

if __name__ == "__main__":
    sys.exit(main())
