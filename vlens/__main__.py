"""`python -m vlens ...` (and `torchrun -m vlens ...`): the `vlens` command line."""

import sys

from vlens.cli import main

if __name__ == "__main__":
    sys.exit(main())
