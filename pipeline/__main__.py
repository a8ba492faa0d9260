"""`python -m pipeline` is `opsynth`."""

import sys

from pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
