"""The main job's worker: computes table cells in a process of its own, so that a kernel which
hangs or crashes the process cannot take the run with it.

``python -m property_tests.worker REQUEST EVENTS`` reads a JSON request (a
``property_tests.request.WorkRequest``: the kernel specs, the cells to compute,
the options) and appends one JSON line per event to EVENTS: ``start`` (a cell
begins), ``problem`` (the problem a kernel is about to be called on), ``cell``
(a cell's result: a ``property_tests.table.CellOutcome`` as JSON), ``error``
(an exception that ended the worker: one its setup raised, or one a cell let
through, such as the ``SystemExit`` of a kernel that calls ``sys.exit``) and
``end`` (every cell was reported). The main job reads them as they come, and
restarts a worker after the cell a kernel crashed or hung in.

Its reports go to EVENTS alone, never to its stdout or stderr (a kernel may
close them), and it ends with ``os._exit`` once EVENTS is written: threads a
kernel left running, or an exit handler, cannot keep it alive.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from property_tests.request import WorkRequest

__all__ = ["describe_exception", "main"]

_exit = os._exit  # the worker's own, whatever a kernel does to os._exit


def describe_exception(exc: BaseException) -> str:
    """One line naming an exception: ``Type: message``, or ``SystemExit(0)`` for one that is no error (an
    exit request, an interrupt), whose message alone would say nothing."""
    if not isinstance(exc, Exception):
        return f"{type(exc).__name__}({', '.join(map(repr, exc.args))})"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:500]}" if text else type(exc).__name__


def _work(request: WorkRequest, emit: Callable[..., None]) -> None:
    for name, value in request.environ.items():
        os.environ.setdefault(name, value)  # before anything imports jax
    from gmm_kernels import triton_interpreter

    triton_interpreter.use_if_no_gpu()  # before a kernel's module is imported (its @triton.jit reads it)
    from gmm_kernels import device
    from gmm_kernels.base import observe_calls
    from property_tests.failures import CheckRun
    from property_tests.profiles import register_profiles
    from property_tests.request import resolve_request
    from property_tests.table import Cell, CellOutcome, check_cells, run_cell

    register_profiles()
    device.select(request.device, option="the request's device")
    kernels = {k.name: k for k in resolve_request(request)}
    # the worker's cells: an exception a kernel raises is reported in its first cell; a failing example is told to
    # the supervisor as soon as it is found, before it is shrunk
    checks = CheckRun(lambda kernel, where, line: emit(event="found", kernel=kernel, where=where, text=line))

    def run(cell: Cell, seed: int | None) -> CellOutcome:
        return run_cell(kernels[cell.kernel], cell.family, cell.column, max_examples=request.max_examples,
                        seed=seed, golden_dir=request.golden_dir, require_own=request.require_own,
                        example_db=request.example_db, run=checks, tier=request.tier)

    def started(cell: Cell, extra: bool) -> None:
        emit(event="start", kernel=cell.kernel, family=cell.family, column=cell.column, extra=extra)

    forget = observe_calls(lambda adapter, problem: emit(event="problem", kernel=adapter.name,
                                                         text=problem.describe()))
    try:  # the deadline is the kernel's time budget: rounds of more examples for its passed cells
        for cell, o, extra in check_cells(request.cells, run, started, deadline=request.deadline, seed=request.seed,
                                          fail_fast=request.fail_fast, rounds_from=request.rounds_from):
            emit(event="cell", kernel=cell.kernel, family=cell.family, column=cell.column, result=o.to_json(),
                 extra=extra)
    finally:
        forget()


def main(argv: list[str] | None = None) -> int:
    """Compute the request's cells into EVENTS; 0 when every cell was reported, else 1 (after an ``error``
    event naming what ended it)."""
    request_path, events_path = (argv if argv is not None else sys.argv[1:])[:2]
    with open(events_path, "a", buffering=1) as events:
        def emit(**event: Any) -> None:
            events.write(json.dumps(event) + "\n")
            events.flush()

        try:
            _work(WorkRequest.from_json(json.loads(Path(request_path).read_text())), emit)
        except BaseException as exc:  # noqa: BLE001 - whatever ends the worker is reported, SystemExit too
            emit(event="error", text=describe_exception(exc), traceback=traceback.format_exc()[-3000:])
            return 1
        emit(event="end")
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except BaseException:  # noqa: BLE001 - EVENTS could not be written: the exit status says it failed
        code = 1
        with contextlib.suppress(Exception):
            traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):  # what a kernel printed, if it left the streams open
        with contextlib.suppress(Exception):
            stream.flush()
    _exit(code)
