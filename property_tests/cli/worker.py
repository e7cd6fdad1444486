"""The main job's worker: computes table cells in a process of its own, so that a kernel which
hangs or crashes the process cannot take the run with it.

``python -m property_tests.cli.worker REQUEST EVENTS`` reads a JSON request (a
``property_tests.cli.request.WorkRequest``: the kernel specs, the cells to compute,
the options) and appends one JSON line per ``property_tests.cli.request.WorkerEvent``
to EVENTS. The main job reads them as they come, and restarts a worker after the
cell a kernel crashed or hung in. :func:`compute` is the work itself, the same
whether a worker does it or the main job in its own process (``--in-process``).

Its reports go to EVENTS alone (a descriptor of a file named nowhere, ``/dev/fd/N``), never to its stdout or
stderr (a kernel may close them); it makes itself non-dumpable, so that a kernel's host process
(``gmm_kernels.sandbox.host``) cannot reach that descriptor through ``/proc``. It ends with ``os._exit`` once
EVENTS is written: threads a
kernel left running, or an exit handler, cannot keep it alive.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from property_tests.cli.request import WorkerEvent, WorkRequest

if TYPE_CHECKING:
    from gmm_kernels import KernelAdapter

__all__ = ["compute", "describe_exception", "main"]

_exit = os._exit  # the worker's own, whatever a kernel does to os._exit


def describe_exception(exc: BaseException) -> str:
    """One line naming an exception: ``Type: message``, or ``SystemExit(0)`` for one that is no error (an
    exit request, an interrupt), whose message alone would say nothing."""
    if not isinstance(exc, Exception):
        return f"{type(exc).__name__}({', '.join(map(repr, exc.args))})"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:500]}" if text else type(exc).__name__


def compute(request: WorkRequest, kernels: Mapping[str, KernelAdapter], emit: Callable[[WorkerEvent], None], *,
            contain_exits: bool = False) -> None:
    """Compute ``request``'s cells of ``kernels`` (by name) under the run policy (``engine.run_checks``: the cells
    in the order given, fail-fast, the kernel's time budget), reporting each step to ``emit``. With
    ``contain_exits`` (the main job's own process) a ``SystemExit`` a cell lets through is that cell's failure;
    in a worker it ends the worker, whose supervisor names it."""
    from gmm_kernels import Status
    from gmm_kernels.base import observe_calls
    from gmm_kernels.sandbox.host import HostCrashed
    from property_tests.checks.engine import run_checks
    from property_tests.checks.failures import CheckRun
    from property_tests.cli.cells import CELL_OUTCOMES, run_cell
    from property_tests.cli.table import CellOutcome, TableCell, not_run

    # an exception a kernel raises is reported in its first cell; a failing example is said as soon as it is found,
    # before it is shrunk
    checks = CheckRun(lambda kernel, where, line: emit(WorkerEvent("found", kernel=kernel, where=where, text=line)))

    crashes: dict[str, int] = {}
    last: dict[str, str] = {}

    def run(cell: TableCell, seed: int | None) -> CellOutcome:
        from property_tests.cli.supervisor import Supervisor

        if crashes.get(cell.kernel, 0) >= Supervisor.MAX_LOST:  # as the supervisor does with crashed workers
            return CellOutcome(Status.UNSUPPORTED, f"not run: {cell.kernel} crashed or hung in "
                                                   f"{crashes[cell.kernel]} cells already (see their notes)")
        try:
            return run_cell(kernels[cell.kernel], cell, request, seed=seed, run=checks)
        except HostCrashed as exc:  # the kernel's own process ended: this cell's crash; a new one takes the next
            crashes[cell.kernel] = crashes.get(cell.kernel, 0) + 1
            what = f"{exc}; the last problem it was given: {last.get(cell.kernel, '(none)')}"
            return CellOutcome(Status.FAILED, what, details=(f"== {' / '.join(map(str, cell))}\n{what}",))
        except (SystemExit, GeneratorExit) as exc:
            if not contain_exits:
                raise
            what = f"{type(exc).__name__}({', '.join(map(repr, exc.args))}) was raised in the cell"
            report = f"== {' / '.join(map(str, cell))}\nthe kernel {what}"
            return CellOutcome(Status.FAILED, what, details=(report,))

    def _left_out(cell: TableCell, failure: TableCell) -> CellOutcome:
        return not_run(failure)

    def observed(adapter: KernelAdapter, problem: Any) -> None:
        last[adapter.name] = problem.describe()
        emit(WorkerEvent("problem", kernel=adapter.name, text=last[adapter.name]))

    forget = observe_calls(observed)
    try:  # the deadline is the kernel's time budget: rounds of more examples for its passed cells
        for cell, o, extra in run_checks(request.cells, run, CELL_OUTCOMES, seed=request.seed,
                                         left_out=_left_out if request.fail_fast else None,
                                         deadline=request.deadline,
                                         rounds_from=request.rounds_from,
                                         started=lambda c, extra: emit(WorkerEvent("start", cell=c, extra=extra))):
            emit(WorkerEvent("cell", cell=cell, outcome=o, extra=extra))
    finally:
        forget()


def _work(request: WorkRequest, emit: Callable[[WorkerEvent], None]) -> None:
    """The worker process's set-up (its environment before anything imports jax, the Triton interpreter, the
    profiles, the device), then :func:`compute`."""
    for name, value in request.environ.items():
        os.environ.setdefault(name, value)  # the main job's environment, before anything imports jax
    from gmm_kernels.runtimes.process import prepare_process

    prepare_process(host=False)  # before a kernel's module is imported (its @triton.jit reads it)
    from gmm_kernels.sandbox import device
    from property_tests.checks.profiles import register_profiles
    from property_tests.cli.request import resolve_request

    register_profiles()
    device.select(request.device, option="the request's device")
    compute(request, {k.name: k for k in resolve_request(request)}, emit)


def main(argv: list[str] | None = None) -> int:
    """Compute the request's cells into EVENTS; 0 when every cell was reported, else 1 (after an ``error``
    event naming what ended it)."""
    request_path, events_path = (argv if argv is not None else sys.argv[1:])[:2]
    with open(events_path, "a", buffering=1) as events:
        from gmm_kernels.sandbox.host import no_ptrace

        no_ptrace()  # a kernel's host process can neither open this one's descriptors nor attach to it
        def emit(event: WorkerEvent) -> None:
            events.write(json.dumps(event.to_json()) + "\n")
            events.flush()

        try:
            _work(WorkRequest.from_json(json.loads(Path(request_path).read_text())), emit)
        except BaseException as exc:  # noqa: BLE001 - whatever ends the worker is reported, SystemExit too
            emit(WorkerEvent("error", text=describe_exception(exc), traceback=traceback.format_exc()[-3000:]))
            return 1
        emit(WorkerEvent("end"))
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
