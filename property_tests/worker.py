"""The main job's worker: computes table cells in a process of its own, so that a kernel which
hangs or crashes the process cannot take the run with it.

``python -m property_tests.worker REQUEST EVENTS`` reads a JSON request (the
kernel specs, the cells to compute, the options) and appends one JSON line per
event to EVENTS: ``start`` (a cell begins), ``problem`` (the problem a kernel is
about to be called on), ``cell`` (a cell's text and failure reports). The main
job reads them as they come, and restarts a worker after the cell a kernel
crashed or hung in.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    request_path, events_path = (argv if argv is not None else sys.argv[1:])[:2]
    request: dict[str, Any] = json.loads(Path(request_path).read_text())
    for name, value in request.get("environ", {}).items():
        os.environ.setdefault(name, value)  # before anything imports jax
    from gmm_kernels.base import observe_calls
    from property_tests.main import resolve_request
    from property_tests.profiles import register_profiles
    from property_tests.table import Cell, CellOutcome, check_cells, run_cell

    register_profiles()
    with open(events_path, "a", buffering=1) as events:
        def emit(**event: Any) -> None:
            events.write(json.dumps(event) + "\n")
            events.flush()

        observe_calls(lambda adapter, problem: emit(event="problem", kernel=adapter.name, text=problem.describe()))
        kernels = {k.name: k for k in resolve_request(request)}

        def run(cell: Cell, seed: int | None) -> CellOutcome:
            kernel, family, column = cell
            return run_cell(kernels[kernel], family, column, max_examples=request["max_examples"], seed=seed,
                            golden_dir=request.get("golden_dir"), require_own=request.get("require_own", False),
                            example_db=request.get("example_db"))

        def started(cell: Cell, extra: bool) -> None:
            emit(event="start", kernel=cell[0], family=cell[1], column=cell[2], extra=extra)

        # the deadline is the kernel's time budget: rounds of more examples for its passed cells
        for (kernel, family, column), o, extra in check_cells(map(tuple, request["cells"]), run, started,
                                                             deadline=request.get("deadline"),
                                                             seed=request.get("seed")):
            emit(event="cell", kernel=kernel, family=family, column=column, text=o.text, details=o.details,
                 seconds=o.seconds, coverage=o.coverage, extra=extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
