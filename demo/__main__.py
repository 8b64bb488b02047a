"""`python -m demo`: launch the web demo (see `python -m demo --help`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
