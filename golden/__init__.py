"""This repository's golden outputs (``golden/data``) and the script that makes them.

Run from the repository root: ``python -m golden regenerate|verify|check|list``.
The logic lives in the installed :mod:`property_tests.goldens`; the corpus in
:mod:`golden.cases`.
"""

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
