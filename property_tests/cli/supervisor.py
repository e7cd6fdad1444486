"""The main job's supervisor: runs a kernel's cells in worker processes (``property_tests.cli.worker``) and turns
every way a worker can end into a verdict.

A worker reports events (a cell begins, the problem a kernel is about to be given, a cell's verdict, an error
that ended it, the end of its cells) to a file the supervisor reads as they come. A worker that ends before it
reported all its cells has crashed, whatever its exit status (0 included): the cell it was in, or the next one,
is a failure naming how it ended (the exit status or signal, or the exception that ended it) and the last
problem the kernel was given, and a fresh worker takes the cells after it, so every worker makes progress. A
cell past ``--timeout`` and a worker silent outside a cell are killed and named; a worker that reported every
cell and does not exit (a thread it cannot end) is done, and killed after a grace. After ``MAX_LOST`` such
cells a kernel's other cells are not run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gmm_kernels import Status
from gmm_kernels.sandbox.host import ended
from property_tests.checks.failures import found_line
from property_tests.cli.request import WorkerEvent, WorkRequest
from property_tests.cli.shards import TableCell
from property_tests.cli.table import CellOutcome, Table, failure_line, not_run

__all__ = ["Supervisor", "WorkerState", "ended", "take_event"]


def take_event(event: WorkerEvent, table: Table, *, verbose: bool) -> None:
    """What a run does with a worker's event, in a worker's supervisor and in the main job's own process alike: a
    failing example found is said now (before it is shrunk); a cell's outcome goes into ``table``, a failure is
    said as soon as it is found (a round of the budget too), and with ``verbose`` every cell is."""
    if event.kind == "found":
        print(found_line(event.kernel, event.where, event.text), file=sys.stderr, flush=True)
    elif event.kind == "cell":
        cell, outcome = event.cell, event.outcome
        assert cell is not None and outcome is not None  # (WorkerEvent holds a cell event to both)
        table.add(cell, outcome)
        if outcome.status.failure:
            print(failure_line(cell, outcome), file=sys.stderr, flush=True)
        if verbose:
            print(f"  {cell.kernel:<34} {cell.family or '':<9} {cell.column:<17} "
                  f"{outcome.text[:70]}  [{outcome.seconds:.1f}s]", file=sys.stderr, flush=True)


@dataclass
class WorkerState:
    """What the supervisor knows of the worker it watches: when it last reported (``since``, monotonic) and when
    its cell began (``started``), the cells it reported (``done``), the cell it is in, the last problem the kernel
    was given, the error that ended it (with its traceback) and whether it reported the end of its cells."""

    since: float
    started: float
    done: int = 0
    cell: TableCell | None = None
    problem: str = ""
    error: str | None = None
    traceback: str = ""
    end: bool = False


class Supervisor:
    """Runs the cells in worker processes, restarting one after a crash or a hang.

    A worker that ends before it reported all its cells crashed, whatever its exit status: the cell it was in
    (or the next one) is a failure naming how it ended and the last problem the kernel was given, and a new
    worker takes the cells after it. Every worker makes progress (it reports a cell or loses one), so a run
    ends; a worker silent past the time limits is killed."""

    def __init__(self, request: WorkRequest, table: Table, timeout: float, verbose: bool) -> None:
        self.request, self.table, self.timeout, self.verbose = request, table, timeout, verbose
        self.workdir = Path(tempfile.mkdtemp(prefix="gmm-harness-"))

    #: after this many crashed or hung cells, a kernel's other cells are not run
    MAX_LOST = 2
    #: seconds a worker may spend outside a cell (starting, between cells) before it is reported as hung: the
    #: ``--timeout``, but no less than this (a loaded machine may take a while to import its frameworks)
    MIN_IDLE = 120.0
    #: seconds a worker that reported every cell may take to exit before it is killed (no failure: it is done)
    EXIT_GRACE = 10.0
    #: the worker's command line (a test may put a stand-in here)
    COMMAND = (sys.executable, "-m", "property_tests.cli.worker")

    def run(self, cells: Sequence[Sequence[Any]]) -> None:
        pending = [TableCell(*c) for c in cells]
        lost: dict[str, int] = {}
        try:
            while pending:
                done = self._worker(pending)
                if done >= len(pending):
                    return
                done_cell = pending[done]  # the cell it crashed or hung in: a failure already
                kernel = done_cell.kernel
                lost[kernel] = lost.get(kernel, 0) + 1
                pending = pending[done + 1:]  # at least one cell fewer: no restart without progress
                if self.request.fail_fast:  # the lost cell is the kernel's first failure
                    left_out = not_run(done_cell)
                elif lost[kernel] >= self.MAX_LOST:
                    left_out = CellOutcome(Status.UNSUPPORTED, f"not run: {kernel} crashed or hung in {lost[kernel]} "
                                                               "cells already (see their notes)")
                else:
                    continue
                for cell in [c for c in pending if c.kernel == kernel]:
                    self.table.put(cell, left_out)
                pending = [c for c in pending if c.kernel != kernel]
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _worker(self, cells: list[TableCell]) -> int:
        """Run a worker on ``cells``; the cells it completed. Fewer than all: it died or hung in the next one,
        which is reported as a failure."""
        request_path, events_path = self.workdir / "request.json", self.workdir / "events.jsonl"
        request_path.write_text(json.dumps(replace(self.request, cells=tuple(cells)).to_json()))
        events_path.write_text("")
        # the worker gets the events file as a descriptor of a file no longer named anywhere: nothing the worker
        # starts (a kernel's host process) inherits it or can open it by name (docs/threat-model.md)
        events = events_path.open()
        writer = os.open(events_path, os.O_WRONLY | os.O_APPEND)
        events_path.unlink()
        state = WorkerState(since=time.monotonic(), started=time.monotonic())
        try:
            proc = subprocess.Popen([*self.COMMAND, str(request_path), f"/dev/fd/{writer}"], pass_fds=(writer,),
                                    env={**self.request.environ, **os.environ}, stdin=subprocess.DEVNULL)
        except OSError as exc:
            why = f"crashed: its worker could not be started: {exc}"
        else:
            os.close(writer)
            writer = -1
            why = self._watch(proc, events, state, len(cells))
        finally:
            if writer >= 0:
                os.close(writer)
            events.close()
        if state.done < len(cells):
            state.cell = state.cell or cells[state.done]  # it died before it began the cell
            self._lost(state, why or "crashed: its worker ended before it reported the cell")
        elif why and state.cell is not None:  # in an extra round of the time budget
            self._lost(state, why)
        return state.done

    def _watch(self, proc: subprocess.Popen, events: Any, state: WorkerState, n: int) -> str:
        """Read the worker's events until it ends; how it ended ("" when it was done)."""
        pending = ""  # a line the worker is still writing (a long event arrives in pieces)
        while True:
            pending += events.readline()
            if pending.endswith("\n"):
                self._event(pending, state)
                pending = ""
                continue
            if proc.poll() is not None:
                for line in (pending + events.read()).splitlines(keepends=True):  # what it wrote before it exited
                    if line.endswith("\n"):
                        self._event(line, state)
                if state.end and state.done >= n:
                    return ""
                if state.error and state.cell:
                    return f"crashed: {state.error} was raised in the cell and ended its worker"
                if state.error:
                    return f"crashed: the worker failed before it began the cell: {state.error}"
                return f"crashed: the process {ended(proc.returncode)}"
            why = self._overdue(state, n)
            if why is not None:
                proc.kill()
                proc.wait()
                return why
            time.sleep(0.02)

    def _overdue(self, state: WorkerState, n: int) -> str | None:
        """Why the worker is to be killed now (a cell past the timeout, a silent worker), or None."""
        now = time.monotonic()
        if state.cell is not None:
            return f"timed out after {self.timeout:g} s" if now - state.started > self.timeout else None
        silent = now - state.since
        if state.done >= n and (state.end or self.request.deadline is None):
            return "" if silent > self.EXIT_GRACE else None  # done: it only has to exit
        limit = max(self.timeout, self.MIN_IDLE)
        if silent <= limit:
            return None
        return (f"timed out: its worker was silent for {limit:g} s "
                f"{'between cells' if state.done else 'before its first cell'}")

    def _event(self, line: str, state: WorkerState) -> None:
        try:
            event = WorkerEvent.from_json(json.loads(line))
        except (ValueError, TypeError, KeyError, AttributeError):
            return  # not one of the worker's events (a kernel wrote into its file): nothing to record
        state.since = time.monotonic()
        if event.kind == "start":
            state.cell, state.problem, state.started = event.cell, "", state.since
        elif event.kind == "problem":
            state.problem = event.text
        elif event.kind == "error":
            state.error, state.traceback = event.text, event.traceback
        elif event.kind == "end":
            state.end = True
        elif event.kind == "cell":
            # an extra round of the time budget revises a cell already counted
            state.done, state.cell, state.started = state.done + (not event.extra), None, state.since
        take_event(event, self.table, verbose=self.verbose)

    def _lost(self, state: WorkerState, what: str) -> None:
        cell = state.cell
        assert cell is not None  # a lost cell is the one the worker was in, or the next
        before = self.table.get(cell)  # a round of the time budget: the seconds of the rounds before it count
        seconds = (before.seconds if before is not None else 0.0) + time.monotonic() - state.started
        last = f"; the last problem it was given: {state.problem}" if state.problem else ""
        trace = f"\n{state.traceback.rstrip()}" if state.traceback else ""
        report = f"== {cell.kernel} / {cell.family} / {cell.column}\nthe kernel {what}{last}{trace}"
        outcome = CellOutcome(Status.FAILED, f"{what}{last}", seconds=seconds, details=(report,))
        self.table.add(cell, outcome)
        print(failure_line(cell, outcome), file=sys.stderr, flush=True)
