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
derandomized ``gmm-ci`` profile (the same verdict every run) unless ``--seed`` is given.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gmm_kernels import KernelAdapter, Status, resolve_kernels
from property_tests import compile_cache, coverage, example_db, shards
from property_tests.checking import check_known_issue_modes
from property_tests.modes import ALL_MODES, MODES
from property_tests.options import SCOPE_OPTIONS, add_scope_options, apply_scope, modes_option, scope_fields
from property_tests.table import GOLDENS, CellOutcome, Table, cells_of, check_cells, render, run_cell

__all__ = ["main", "resolve_request"]

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
            pending = ""  # a line the worker is still writing (a long event arrives in pieces)
            while True:
                pending += events.readline()
                if pending.endswith("\n"):
                    self._event(json.loads(pending), state)
                    pending = ""
                    continue
                if proc.poll() is not None:
                    rest = events.read()  # what it wrote before it exited
                    for line in (pending + rest).splitlines(keepends=True):
                        if line.endswith("\n"):
                            self._event(json.loads(line), state)
                    break
                if state["cell"] is not None and time.monotonic() - state["started"] > self.timeout:
                    proc.kill()
                    proc.wait()
                    self._lost(state, f"timed out after {self.timeout:g} s")
                    return state["done"], state["done"] < len(cells)  # (in a budget's extra round: all done)
                time.sleep(0.02)
        if proc.returncode != 0 and state["done"] < len(cells):
            state["cell"] = state["cell"] or cells[state["done"]]  # it died before it began the cell
            self._lost(state, f"crashed: the process {_ended(proc.returncode)}")
            return state["done"], True
        if proc.returncode != 0 and state["cell"] is not None:  # in an extra round of the time budget
            self._lost(state, f"crashed: the process {_ended(proc.returncode)}")
        return state["done"], False

    def _event(self, event: dict[str, Any], state: dict[str, Any]) -> None:
        if event["event"] == "start":
            state.update(cell=(event["kernel"], event["family"], event["column"]), started=time.monotonic(),
                         problem="")
        elif event["event"] == "problem":
            state["problem"] = event["text"]
        elif event["event"] == "cell":
            self.table.put(event["kernel"], event["family"], event["column"], event["text"])
            self.table.seconds[(event["kernel"], event["family"], event["column"])] = event["seconds"]
            self.table.details += event["details"]
            if event.get("coverage"):
                self.table.coverage.append(event["coverage"])
            # an extra round of the time budget revises a cell already counted
            state.update(done=state["done"] + (not event.get("extra")), cell=None)
            if self.verbose:
                print(f"  {event['kernel']:<34} {event['family'] or '':<9} {event['column']:<17} "
                      f"{event['text'][:70]}  [{event['seconds']:.1f}s]", file=sys.stderr, flush=True)

    def _lost(self, state: dict[str, Any], what: str) -> None:
        kernel, family, column = state["cell"]
        key = (kernel, family, column)
        self.table.seconds[key] = self.table.seconds.get(key, 0.0) + time.monotonic() - state["started"]
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
    c.add_argument("--modes", default=None, action=_Once, metavar="M,M",
                   help=f"the modes to run (default: all of {', '.join(MODES)}; opt-in: "
                        f"{', '.join(m for m in ALL_MODES if m not in MODES)})")
    c.add_argument("--max-examples", type=_positive(int), default=None,
                   help="examples per (kernel, family, mode) at most (default: the gmm-ci profile's budget, at "
                        "least two per cell of the covering design, so that every pair of relations is reached; "
                        "fewer runs only the first cells, and -v lists the pairs missed)")
    c.add_argument("--seed", type=int, default=None,
                   help="explore with this seed (default: the derandomized gmm-ci profile)")
    c.add_argument("--budget", type=_positive(float), default=None, action=_Once, metavar="SECONDS",
                   help="time per kernel: after every cell ran its examples (the default run, which reaches every "
                        "pair of relations), rounds of new examples for its passed cells until the time is spent "
                        "(default: none)")
    c.add_argument("--timeout", type=_positive(float), default=900.0,
                   help="seconds one cell may run before the kernel is reported as hung (default 900)")
    c.add_argument("--in-process", action="store_true", help="run the kernels in this process (no isolation)")
    c.add_argument("--jobs", "-j", type=_positive(int), default=None, action=_Once,
                   help="kernels checked at once, each in its own worker (default: the CPU count, at most one "
                        "per kernel)")
    c.add_argument("--compile-cache", default=None, action=_Once, metavar="DIR|off",
                   help="JAX persistent compilation cache, shared by the workers and later runs "
                        "(default: $XDG_CACHE_HOME/gmm-harness/jax)")
    c.add_argument("--example-db", default=None, action=_Once, metavar="DIR|redis://HOST:PORT|off",
                   help="Hypothesis example database: every failing example is saved there and replayed first by "
                        "every run sharing it (default: $GMM_HARNESS_EXAMPLE_DB, else off)")
    split = c.add_argument_group("splitting the run across machines (gmm-harness merge joins the shards)")
    split.add_argument("--shard", default=None, action=_Once, metavar="I/N",
                       help="check only this machine's shard of the kernel x mode cells, I of N (with --json)")
    split.add_argument("--durations", default=None, action=_Once, metavar="FILE",
                       help="an earlier run's --json: its cell times balance the shards (the same file everywhere)")
    scope = c.add_argument_group("declared scope of the --kernel(s): exactly this is checked")
    add_scope_options(lambda *a, **kw: scope.add_argument(*a, **kw, **({} if kw.get("action") else
                                                                       {"action": _Once})))
    goldens = c.add_argument_group("goldens")
    goldens.add_argument("--no-goldens", action="store_true", help="skip the goldens column")
    goldens.add_argument("--golden-dir", default=None, action=_Once,
                         help="golden directory (default: this project's goldens, wherever it is installed)")
    goldens.add_argument("--kernel-version", default=None, action=_Once,
                         help="the --kernel's version: its own goldens must exist and match bit for bit")
    c.add_argument("--json", default=None, action=_Once, metavar="FILE", help="also write the results as JSON")
    c.add_argument("-v", "--verbose", action="store_true",
                   help="print every failure's full report and every cell's coverage of relations")
    coverage.add_parser(sub)
    m = sub.add_parser("merge", help="join the --json files of the shards of one run into its table")
    m.add_argument("files", nargs="+", metavar="SHARD.json", help="every shard's --json file")
    m.add_argument("--json", default=None, action=_Once, metavar="FILE", help="also write the merged results")
    m.add_argument("-v", "--verbose", action="store_true", help="print every failure's full report")
    return parser


def _options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """(modes, scope option values) after the checks no single option can make; usage errors via ``parser``."""
    modes = modes_option(args.modes, ALL_MODES, parser.error, default=MODES)
    values = {name: getattr(args, name.replace("-", "_")) for name, _ in SCOPE_OPTIONS}
    given = [f"--{n}" for n, v in values.items() if v] + [o for o, v in (
        ("--convention", args.convention), ("--kernel-version", args.kernel_version)) if v is not None]
    if given and not args.kernel:
        parser.error(f"{given[0]}: given without --kernel, which it applies to")
    if args.kernel_version is not None and len(args.kernel) != 1:
        parser.error("--kernel-version: applies to one --kernel, got " + str(len(args.kernel)))
    if args.jobs is not None and args.in_process:
        parser.error("--jobs: given with --in-process, which checks the kernels in this process, one at a time")
    if args.no_goldens and (args.golden_dir or args.kernel_version):
        parser.error("--no-goldens: given with --golden-dir/--kernel-version, which need the goldens")
    if args.golden_dir is not None and not Path(args.golden_dir, "manifest.json").is_file():
        parser.error(f"--golden-dir: expected a golden directory with a manifest.json, got {args.golden_dir!r}")
    try:
        args.shard = None if args.shard is None else shards.parse_shard(args.shard)
        args.durations = None if args.durations is None else shards.load_durations(args.durations)
        if args.example_db is not None:
            example_db.open_database(args.example_db, option_name="--example-db")
    except (ValueError, TypeError, ImportError) as exc:
        parser.error(str(exc))
    if args.shard is not None and args.json is None:
        parser.error("--shard: given without --json, which gmm-harness merge joins the shards from")
    if args.durations is not None and args.shard is None:
        parser.error("--durations: given without --shard, which it balances")
    return modes, values


def resolve_request(request: dict[str, Any]) -> list[KernelAdapter]:
    """The kernels of a request (here and in the worker): resolved, scoped, versioned."""
    kernels = resolve_kernels(request["kernels"], convention=request.get("convention"), tiling=request.get("tiling"))
    fields = scope_fields(request.get("scope") or {})
    for k in kernels:
        apply_scope(k, fields)
        if request.get("kernel_version"):
            k.version = request["kernel_version"]
        if request.get("kernels"):
            check_known_issue_modes(k, option="--kernel")
    return kernels


def _run(args: argparse.Namespace, request: dict[str, Any], kernels: dict[str, KernelAdapter],
         plan: list[shards.Cell], cells: list[shards.Cell], table: Table) -> None:
    """Check ``cells`` (all of the ``plan``, or a shard's part) into ``table``, which gets every row of the plan."""
    table.plan(plan)
    if args.in_process:
        def run(cell: shards.Cell, seed: int | None) -> CellOutcome:
            return run_cell(kernels[cell[0]], cell[1], cell[2], max_examples=args.max_examples, seed=seed,
                            golden_dir=request["golden_dir"], require_own=request["require_own"],
                            example_db=request["example_db"])

        def put(cell: shards.Cell, o: CellOutcome) -> None:
            table.put(*cell, o.text)
            table.seconds[cell] = o.seconds
            table.details += o.details
            table.coverage += [o.coverage] if o.coverage else []

        for name in dict.fromkeys(c[0] for c in cells):  # kernel by kernel: the budget is each kernel's
            deadline = time.time() + args.budget if args.budget else None
            for cell, o, _ in check_cells([c for c in cells if c[0] == name], run, lambda c, extra: None,
                                          deadline=deadline, seed=args.seed):
                put(cell, o)
        return
    # one lane per job; a lane takes the next kernel and checks all its cells in one worker, so the shapes a
    # kernel compiled for one mode serve its other modes; each kernel fills a table of its own, merged in
    # kernel order, so the report does not depend on which lane finished first
    by_kernel: dict[str, list[tuple[str, str | None, str]]] = {}
    for cell in cells:
        by_kernel.setdefault(cell[0], []).append(cell)
    tables = {name: Table() for name in by_kernel}

    def check(name: str) -> None:
        tables[name].plan([c for c in plan if c[0] == name])  # every row, even for a shard with the goldens alone
        lane = {**request, "deadline": time.time() + args.budget if args.budget else None}  # the kernel's budget
        _Supervisor(lane, tables[name], args.timeout, verbose=True).run(by_kernel[name])

    jobs = min(args.jobs or os.cpu_count() or 1, len(by_kernel))
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="gmm-lane") as lanes:
        list(lanes.map(check, by_kernel))  # an error in a lane is raised here, not lost with its thread
    for kernel_table in tables.values():
        table.merge(kernel_table)


def _shape_unit(cell: shards.Cell) -> tuple[Any, ...]:
    """Cells that compile the same shapes: a kernel's family in the modes whose problems differ only in their
    values (exact, normal, wide, poisoned, all_empty), else the cell alone."""
    kernel, family, column = cell
    mode = ALL_MODES.get(column)
    if mode is None:  # the goldens
        return (kernel, column)
    shaped = any(k not in ("values", "all_empty") for k in mode.options)
    return (kernel, family, column if shaped else "the exact mode's shapes")


def _header(kernels: list[KernelAdapter], request: dict[str, Any]) -> str:
    lines = []
    for k in kernels:
        if k.scope is not None:
            lines.append(f"{k.name} ({k.convention}) declared scope: {k.scope.describe()}")
        if getattr(k, "version", None) and request.get("kernel_version"):
            lines.append(f"{k.name} version {k.version}: its own goldens must match bit for bit")
    if request["modes"] != list(MODES):
        lines.append(f"modes: {', '.join(request['modes'])}")
    return "\n".join(lines)


def _run_text(seed: int | None, budget: float | None) -> str:
    """How the examples were chosen, for the summary line (of a run, or of the merge of its shards)."""
    run = f"seed {seed}" if seed is not None else "gmm-ci profile, derandomized"
    return run + (f"; then rounds of new examples for {budget:g} s a kernel" if budget else "")


def _status(text: str) -> str:
    for status in Status:
        if text.startswith(status.value):
            return status.value
    return "?"


def _json_cells(table: Table, cells: list[shards.Cell]) -> list[dict[str, Any]]:
    """The run's cells in plan order, each with its text, status and seconds (the goldens once per kernel)."""
    out = []
    for kernel, family, column in cells:
        families = [family] if family is not None else [f for (k, f) in table.rows if k == kernel]
        for f in families:
            text = table.rows.get((kernel, f), {}).get(column, "")
            out.append({"kernel": kernel, "family": f, "check": column, "status": _status(text), "text": text,
                        "seconds": round(table.seconds.get((kernel, family, column), 0.0), 2)})
    return out


def _write_json(path: str, doc: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


def _finish(parser: argparse.ArgumentParser, table: Table, columns: list[str], *, requested: list[str],
            seconds: float, run: str, verbose: bool, json_path: str | None, doc: dict[str, Any],
            partial: bool = False) -> int:
    """Print the table and its summary, write the JSON; the exit status (1: a cell failed; 2: nothing checked)."""
    print(render(table.as_rows(), columns))
    n_fail = sum(v.startswith("FAIL") for v in table.values())
    n_pass = sum(v.startswith("pass") for v in table.values())
    print(f"\n{n_pass} passed, {n_fail} failed  ({seconds:.0f} s; {run}; 'n/a' cells give their reason)")
    # a shard may hold only a kernel's n/a cells: whether a kernel was checked at all is the merge's to say
    idle = [] if partial else [name for name in requested if table.checked_nothing(name)]
    if json_path:
        _write_json(json_path, {**doc, "failures": table.details, "coverage": table.coverage, "passed": n_pass,
                                "failed": n_fail, "seconds": round(seconds, 1), "checked_nothing": idle})
    if idle:
        parser.error(f"--kernel: nothing was checked for {', '.join(idle)}: every cell is n/a (see the notes)")
    if verbose and table.coverage:
        print("\nCoverage (pairs of relations of the covering design; docs/coverage.md):\n"
              + "\n".join(table.coverage))
    if table.details and verbose:
        print("\n" + "\n\n".join(table.details))
    elif table.details:
        print("run with -v for the full mismatch reports and reproducers")
    return 1 if n_fail else 0


def _merge(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    doc = shards.load_shards(args.files, parser.error)
    table = Table()
    plan = [tuple(c) for c in doc["plan"]]
    table.plan(plan)
    for c in doc["cells"]:  # the goldens come once per family row
        table.put(c["kernel"], c["family"], c["check"], c["text"])
    table.details, table.coverage = doc["failures"], doc["coverage"]
    columns = doc["modes"] + ([GOLDENS] if doc["goldens"] else [])
    n = len(doc["shards"])
    run = _run_text(doc["seed"], doc.get("budget"))
    print(f"merged {n} shards ({', '.join(f'{s:.0f} s' for s in doc['shard_seconds'] if s is not None)})\n")
    merged = {k: v for k, v in doc.items() if k not in ("failures", "coverage", "seconds")}
    requested = [k["name"] for k in doc["kernels"]] if doc.get("requested") else []
    return _finish(parser, table, columns, requested=requested, seconds=doc["seconds"],
                   run=f"{run}; seconds summed over the shards", verbose=args.verbose, json_path=args.json,
                   doc={**merged, "cells": doc["cells"]})


def main(argv: Sequence[str] | None = None) -> int:
    for name, value in _ENVIRON.items():  # 8 virtual CPU devices, set before anything imports jax
        os.environ.setdefault(name, value)
    if not {"", os.getcwd()} & set(sys.path):  # as with python -m: --kernel mymodule:fn imports from here
        sys.path.insert(0, os.getcwd())
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "coverage":
        return coverage.run(parser, args)
    if args.command == "merge":
        return _merge(parser, args)
    modes, scope_values = _options(parser, args)
    try:
        cache_line = compile_cache.enable(args.compile_cache, option_name="--compile-cache")  # before jax loads
    except ValueError as exc:
        parser.error(str(exc))
    request = {"kernels": args.kernel, "convention": args.convention, "tiling": args.tiling, "modes": modes,
               "scope": scope_values, "max_examples": args.max_examples, "seed": args.seed,
               "golden_dir": None if args.golden_dir is None else str(Path(args.golden_dir).resolve()),
               "kernel_version": args.kernel_version, "require_own": args.kernel_version is not None,
               "example_db": args.example_db, "environ": _ENVIRON}
    try:
        kernels = resolve_request(request)
    except (ValueError, TypeError, ImportError) as exc:
        parser.error(str(exc))
    request["kernels"] = args.kernel or [k.name for k in kernels]
    plan = [c for k in kernels for c in cells_of(k, goldens=not args.no_goldens, modes=request["modes"])]
    cells = plan
    if args.shard is not None:
        i, n = args.shard
        cells = shards.assign(plan, n, args.durations, unit=_shape_unit)[i - 1]
        if not cells:
            parser.error(f"--shard: shard {i}/{n} has no cells: the run has {len(plan)}, fewer than {n} shards")
    t0 = time.perf_counter()
    table = Table()
    header = _header(kernels, request)
    if args.verbose:
        header = "\n".join(filter(None, [header, cache_line, example_db.describe(args.example_db)]))
    if args.shard is not None:
        header = "\n".join(filter(None, [header, f"shard {args.shard[0]}/{args.shard[1]}: {len(cells)} of the "
                                                  f"{len(plan)} cells (gmm-harness merge joins the shards)"]))
    if header:
        print(header + "\n")
    _run(args, request, {k.name: k for k in kernels}, plan, cells, table)
    columns = modes + ([] if args.no_goldens else [GOLDENS])
    run = _run_text(args.seed, args.budget)
    doc = {"kernels": [{"name": k.name, "convention": k.convention, "available": k.available(),
                        "scope": None if k.scope is None else k.scope.to_json()} for k in kernels],
           "requested": bool(args.kernel), "modes": request["modes"], "goldens": not args.no_goldens,
           "max_examples": request["max_examples"], "seed": request["seed"], "budget": args.budget,
           "golden_dir": request["golden_dir"],
           "shard": list(args.shard) if args.shard else None, "plan": [list(c) for c in plan],
           "cells": _json_cells(table, cells)}
    return _finish(parser, table, columns, requested=[k.name for k in kernels] if args.kernel else [],
                   seconds=time.perf_counter() - t0, run=run, verbose=args.verbose, json_path=args.json, doc=doc,
                   partial=args.shard is not None)

if __name__ == "__main__":
    sys.exit(main())
