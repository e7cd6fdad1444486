"""``python -m golden regenerate|verify|check|list`` (see :mod:`golden.cli`)."""

import sys

from golden.cli import main

if __name__ == "__main__":
    sys.exit(main())
