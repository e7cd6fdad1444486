"""golden: golden outputs for grouped-GEMM kernels, this project's own and a downstream repository's.

- :mod:`golden.case` / :mod:`golden.generator`: a case is a small JSON-able
  spec whose inputs are recomputed bit for bit from a documented generator;
- :mod:`golden.store`: a directory of hashed ``.npz`` files and a manifest,
  written atomically;
- :mod:`golden.judge`: kernels against the goldens (:func:`check_goldens`);
- :mod:`golden.staleness`: goldens made from another version of their case,
  and the commands that remake every golden of a case;
- :mod:`golden.regeneration`, :mod:`golden.verification`, :mod:`golden.cli`
  (``python -m golden``, from any working directory).

This project's corpus is :data:`golden.cases.CASES`; its data ships in
``golden/data`` (:data:`DATA`). docs/goldens.md has the format and a worked
example for a downstream repository.
"""

from pathlib import Path

from golden.case import Case, GoldenError, build_problem
from golden.generator import values
from golden.judge import check_goldens
from golden.regeneration import regenerate
from golden.store import GoldenStore
from golden.verification import verify

DATA = Path(__file__).resolve().parent / "data"

__all__ = ["DATA", "Case", "GoldenError", "GoldenStore", "build_problem", "check_goldens", "regenerate", "values",
           "verify"]
