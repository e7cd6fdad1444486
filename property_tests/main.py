"""The main job: check every kernel available here against the reference and the goldens.

``gmm-harness check`` (or ``python -m property_tests.main check``) prints a
kernel x mode table, one row per (kernel, family): ``pass (n examples)``,
``FAIL [note]``, ``n/a [note]`` or ``known bug [note]``, the notes below the
table, plus a goldens column; it exits 1 if anything fails, 2 on a usage error
(or when nothing could be checked for a kernel it was asked for). With ``-v``
every failure's full report and reproducer follows the table.

The cells are computed in a worker process (``property_tests.worker``): a
kernel that hangs past ``--timeout`` or crashes the process is reported as a
failure of the cell it was in, with the last problem it was given, and the run
goes on with the next cell in a fresh worker. Examples come from the
derandomized ``ci`` profile (the same verdict every run) unless ``--seed`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gmm_kernels import KernelAdapter, resolve_kernels
from property_tests.modes import MODES
from property_tests.table import GOLDENS, Table, cells_of, render, run_cell

__all__ = ["main"]

_ENVIRON = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}


def _ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class _Supervisor:
    """Runs the cells in worker processes, restarting one after a crash or a hang."""

    def __init__(self, request: dict[str, Any], table: Table, timeout: float, verbose: bool) -> None:
        self.request, self.table, self.timeout, self.verbose = request, table, timeout, verbose
        self.workdir = Path(tempfile.mkdtemp(prefix="gmm-harness-"))

    #: after this many crashed or hung cells, a kernel's other cells are not run
    MAX_LOST = 2

    def run(self, cells: list[tuple[str, str | None, str]]) -> None:
        pending = list(cells)
        lost: dict[str, int] = {}
        while pending:
            done, failed = self._worker(pending)
            if failed:
                kernel = pending[done][0]
                lost[kernel] = lost.get(kernel, 0) + 1
                pending = pending[done + 1:]
                if lost[kernel] >= self.MAX_LOST:
                    for k, family, column in [c for c in pending if c[0] == kernel]:
                        self.table.put(k, family, column, f"n/a: not run: {kernel} crashed or hung in "
                                                          f"{lost[kernel]} cells already (see their notes)")
                    pending = [c for c in pending if c[0] != kernel]
            else:
                pending = pending[done:]

    def _worker(self, cells: list[tuple[str, str | None, str]]) -> tuple[int, bool]:
        """Run a worker on ``cells``; (cells completed, whether it died or hung in the next one)."""
        request_path, events_path = self.workdir / "request.json", self.workdir / "events.jsonl"
        request_path.write_text(json.dumps({**self.request, "cells": cells}))
        events_path.write_text("")
        proc = subprocess.Popen([sys.executable, "-m", "property_tests.worker", str(request_path), str(events_path)],
                                env={**_ENVIRON, **os.environ})
        state = {"done": 0, "started": time.monotonic(), "problem": "", "cell": None}
        with events_path.open() as events:
            while True:
                line = events.readline()
                if line:
                    self._event(json.loads(line), state)
                    continue
                if proc.poll() is not None:
                    break
                if state["cell"] is not None and time.monotonic() - state["started"] > self.timeout:
                    proc.kill()
                    proc.wait()
                    self._lost(state, f"timed out after {self.timeout:g} s")
                    return state["done"], True
                time.sleep(0.02)
        if proc.returncode != 0 and state["done"] < len(cells):
            state["cell"] = state["cell"] or cells[state["done"]]  # it died before it began the cell
            self._lost(state, f"crashed: the process {_ended(proc.returncode)}")
            return state["done"], True
        return state["done"], False

    def _event(self, event: dict[str, Any], state: dict[str, Any]) -> None:
        if event["event"] == "start":
            state.update(cell=(event["kernel"], event["family"], event["column"]), started=time.monotonic(),
                         problem="")
        elif event["event"] == "problem":
            state["problem"] = event["text"]
        elif event["event"] == "cell":
            self.table.put(event["kernel"], event["family"], event["column"], event["text"])
            self.table.details += event["details"]
            state.update(done=state["done"] + 1, cell=None)
            if self.verbose:
                print(f"  {event['kernel']:<34} {event['family'] or '':<9} {event['column']:<17} "
                      f"{event['text'][:70]}  [{event['seconds']:.1f}s]", file=sys.stderr, flush=True)

    def _lost(self, state: dict[str, Any], what: str) -> None:
        kernel, family, column = state["cell"]
        last = f"; the last problem it was given: {state['problem']}" if state["problem"] else ""
        self.table.put(kernel, family, column, f"FAIL: {what}{last}")
        self.table.details.append(f"== {kernel} / {family} / {column}\nthe kernel {what}{last}")


class _Once(argparse.Action):
    """An option that may be given once: a repeated one is a usage error, not silently the last."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string}: given twice (it takes one value)")
        setattr(namespace, self.dest, values)


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gmm-harness", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="check kernels against the reference and the goldens")
    c.add_argument("--kernel", action="append", default=[], help="built-in adapter name or pkg.module:fn (repeatable)")
    c.add_argument("--convention", default=None, action=_Once, help="convention of the pkg.module:fn kernels")
    c.add_argument("--tiling", default=None, action=_Once, help="TM,TK,TN")
    c.add_argument("--max-examples", type=_positive(int), default=8, help="examples per (kernel, family, mode)")
    c.add_argument("--seed", type=int, default=None,
                   help="explore with this seed (default: the derandomized gmm-ci profile)")
    c.add_argument("--timeout", type=_positive(float), default=900.0,
                   help="seconds one cell may run before the kernel is reported as hung (default 900)")
    c.add_argument("--in-process", action="store_true", help="run the kernels in this process (no isolation)")
    c.add_argument("--no-goldens", action="store_true", help="skip the goldens column")
    c.add_argument("-v", "--verbose", action="store_true", help="print every failure's full report")
    return parser


def _run(args: argparse.Namespace, kernels: list[KernelAdapter], table: Table) -> None:
    cells = [c for k in kernels for c in cells_of(k, goldens=not args.no_goldens)]
    table.plan(cells)
    if args.in_process:
        for k in kernels:
            for _, family, column in cells_of(k, goldens=not args.no_goldens):
                text, details, _ = run_cell(k, family, column, max_examples=args.max_examples, seed=args.seed)
                table.put(k.name, family, column, text)
                table.details += details
        return
    request = {"kernels": args.kernel or [k.name for k in kernels], "convention": args.convention,
               "tiling": args.tiling, "max_examples": args.max_examples, "seed": args.seed, "environ": _ENVIRON}
    _Supervisor(request, table, args.timeout, verbose=True).run(cells)


def main(argv: Sequence[str] | None = None) -> int:
    for name, value in _ENVIRON.items():  # 8 virtual CPU devices, set before anything imports jax
        os.environ.setdefault(name, value)
    if not {"", os.getcwd()} & set(sys.path):  # as with python -m: --kernel mymodule:fn imports from here
        sys.path.insert(0, os.getcwd())
    parser = _parser()
    args = parser.parse_args(argv)
    if args.convention is not None and not args.kernel:
        parser.error("--convention: given without --kernel, which it applies to")
    try:
        kernels = resolve_kernels(args.kernel, convention=args.convention, tiling=args.tiling)
    except (ValueError, TypeError, ImportError) as exc:
        parser.error(str(exc))
    t0 = time.perf_counter()
    table = Table()
    _run(args, kernels, table)
    columns = list(MODES) + ([] if args.no_goldens else [GOLDENS])
    print(render(table.as_rows(), columns))
    idle = [k.name for k in kernels if args.kernel and table.checked_nothing(k.name)]
    if idle:
        parser.error(f"--kernel: nothing was checked for {', '.join(idle)}: every cell is n/a (see the notes)")
    n_fail = sum(v.startswith("FAIL") for v in table.values())
    n_pass = sum(v.startswith("pass") for v in table.values())
    run = f"seed {args.seed}" if args.seed is not None else "gmm-ci profile, derandomized"
    print(f"\n{n_pass} passed, {n_fail} failed  ({time.perf_counter() - t0:.0f} s; {run}; "
          "'n/a' cells give their reason)")
    if table.details and args.verbose:
        print("\n" + "\n\n".join(table.details))
    elif table.details:
        print("run with -v for the full mismatch reports and reproducers")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
