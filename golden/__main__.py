"""``python -m golden``: regenerate, verify and check this repository's goldens (see golden/cases.py).

    python -m golden regenerate [--kernel NAME | --kernel pkg.mod:fn --convention C] [--cases GLOB] [--update]
    python -m golden verify [--cases GLOB]
    python -m golden check [--kernel NAME]
    python -m golden list
"""

import sys

from golden import DATA
from golden.cases import CASES
from property_tests.goldens import main

if __name__ == "__main__":
    sys.exit(main(corpus=CASES, default_dir=DATA, prog="python -m golden"))
