"""`python -m opsynth` is `opsynth`."""

import sys

from opsynth.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
