"""``python -m gna_interp``: the ``gna`` command line (``torchrun --nproc-per-node N -m gna_interp scan ...``
runs a sharded scan, see docs/scaling.md)."""

import sys

from gna_interp._entry import main

if __name__ == "__main__":
    sys.exit(main())
