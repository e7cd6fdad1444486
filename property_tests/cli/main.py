"""The main job: check every kernel available here against the reference and the goldens.

``gmm-harness check`` (or ``python -m property_tests.cli.main check``) prints a
kernel x mode table, one row per (kernel, family): ``pass (n examples)``,
``FAIL [note]``, ``n/a [note]`` or ``known bug [note]``, the notes below the
table, plus a goldens column (a mode in which a kernel declares a known upstream
bug that passed in every family, under gmm-ci's examples, is a FAIL saying the
bug is no longer caught); it exits 1 if anything fails, 2 on a usage error
(or when nothing could be checked for a kernel it was asked for). With ``-v``
every failure's full report and reproducer follows the table. Usage errors
come before any kernel runs, in the command's own usage, with a "did you mean"
for a near-miss name; they include every path the run would write that cannot
be written (``--json``, ``--example-db``, ``--compile-cache``,
``$GMM_REPRO_DIR``). A shard (``--shard I/N``) with no cells writes a shard
file that says it checked nothing and exits 0: ``gmm-harness merge`` judges the
whole run.

The cells are computed in worker processes (``property_tests.cli.worker``, watched
by ``property_tests.cli.supervisor``): a kernel that hangs past ``--timeout``,
crashes the process or ends it (any exit status, 0 included) is reported as a
failure of the cell it was in, with the last problem it was given, and the run
goes on with the next cell in a fresh worker; a kernel's ``sys.exit`` fails the
example it was given. Examples come from the derandomized ``gmm-ci`` profile
(the same verdict every run) unless ``--seed`` is given; ``--tier`` names another plan
(``property_tests.checks.tiers``: ``gmm-quick`` for pull requests, ``gmm-nightly``), and the header, the summary and the
JSON say which tier ran and what it reached (cells of the covering designs run, pairs of relations reached).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from gmm_kernels import KernelAdapter, Status
from gmm_kernels.runtimes.process import HOST_ENVIRON, prepare_process
from gmm_kernels.sandbox import device
from gmm_ref import conventions
from gmm_ref.names import did_you_mean
from property_tests.checks import causes, example_db, large, paths, tiers
from property_tests.checks.modes import ALL_MODES, MODES
from property_tests.cli import coverage, document, shards
from property_tests.cli.document import KernelEntry, RunDocument
from property_tests.cli.options import SCOPE_OPTIONS, add_device_option, add_scope_options, modes_option
from property_tests.cli.request import WorkRequest, resolve_request
from property_tests.cli.shards import TableCell
from property_tests.cli.supervisor import Supervisor, take_event
from property_tests.cli.table import (
    GOLDENS,
    CellOutcome,
    Table,
    cells_of,
    render,
    run_order,
)
from property_tests.cli.worker import compute

__all__ = ["main", "resolve_request"]



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


def _add_example_options(c: argparse.ArgumentParser) -> None:
    """The options of what a run draws: the tier, examples, seed and time budget."""
    c.add_argument("--max-examples", type=_positive(int), default=None,
                   help="examples per (kernel, family, mode) at most (default: the gmm-ci profile's budget, at "
                        "least two per cell of the covering design, so that every pair of relations is reached; "
                        "fewer runs only the first cells, and -v lists the pairs missed)")
    c.add_argument("--seed", type=int, default=None,
                   help="explore with this seed (default: the derandomized gmm-ci profile)")
    c.add_argument("--tier", default=None, action=_Once, metavar="NAME",
                   help=f"what the run checks: {', '.join(tiers.TIERS)} (default: {tiers.DEFAULT}; gmm-quick for pull "
                        "requests: every cell of the covering designs once, the cells most likely to fail first; "
                        "gmm-nightly: gmm-ci, then a time budget of new examples, the large mode, an example "
                        "database; docs/speed.md)")
    c.add_argument("--budget", type=_positive(float), default=None, action=_Once, metavar="SECONDS",
                   help="time per kernel: after every cell ran its examples (the default run, which reaches every "
                        "pair of relations), rounds of new examples for its passed cells until the time is spent "
                        "(default: the tier's: gmm-nightly 300, the others none)")


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
    _add_example_options(c)
    c.add_argument("--timeout", type=_positive(float), default=900.0,
                   help="seconds one cell may run before the kernel is reported as hung (default 900)")
    add_device_option(c.add_argument, action=_Once)
    c.add_argument("-x", "--fail-fast", action="store_true", help="stop a kernel's run at its first failing cell")
    c.add_argument("--in-process", action="store_true",
                   help="check the kernels in this process, a pkg.module:fn kernel imported and called here too "
                        "(for a debugger: no isolation, and a kernel can reach the verdict)")
    c.add_argument("--jobs", "-j", type=_positive(int), default=None, action=_Once,
                   help="kernels checked at once, each in its own worker (default: the CPU count, at most one "
                        "per kernel)")
    c.add_argument("--compile-cache", default=None, action=_Once, metavar="DIR|off",
                   help="JAX persistent compilation cache, shared by the workers and later runs "
                        "(default: $XDG_CACHE_HOME/gmm-harness/jax)")
    c.add_argument("--example-db", default=None, action=_Once, metavar="DIR|redis://HOST:PORT|off",
                   help="Hypothesis example database: every failing example is saved there and replayed first by "
                        "every run sharing it (default: $GMM_HARNESS_EXAMPLE_DB, else the tier's: gmm-nightly "
                        "$XDG_CACHE_HOME/gmm-harness/examples, the others off)")
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
    for command in sub.choices.values():
        command.set_defaults(command_parser=command)
    parser.set_defaults(commands=tuple(sub.choices))
    return parser


def _options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """(modes, scope option values) after the checks no single option can make; usage errors via ``parser``.
    Resolves the tier (``args.tier``, a ``tiers.Tier``) and what it sets that no option gave: the modes, the
    budget, the example database and where the budget's rounds start (``args.rounds_from``)."""
    try:
        args.tier = tiers.tier_of(args.tier or tiers.DEFAULT, option="--tier")
    except ValueError as exc:
        parser.error(str(exc))
    modes = modes_option(args.modes, ALL_MODES, parser.error, default=[*MODES, *args.tier.opt_in])
    args.budget = args.budget if args.budget is not None else args.tier.budget
    args.rounds_from = tiers.first_round_seed(args.tier, args.seed) if args.budget else None
    args.example_db = tiers.example_db_spec(args.example_db, args.tier)
    values = {name: getattr(args, name.replace("-", "_")) for name, _ in SCOPE_OPTIONS}
    given = [f"--{n}" for n, v in values.items() if v] + [o for o, v in (
        ("--convention", args.convention), ("--kernel-version", args.kernel_version)) if v is not None]
    if given and not args.kernel:
        parser.error(f"{given[0]}: given without --kernel, which it applies to")
    known = (*conventions.names(), *conventions.routed_names())
    if args.convention is not None and args.convention not in known:
        parser.error(f"--convention: expected one of {', '.join(known)}, got {args.convention!r}"
                     f"{did_you_mean(args.convention, known)}")
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
    try:
        args.device_asked = args.device or "auto"
        args.device = device.select(args.device_asked, option="--device")  # this process's, and the workers'
    except ValueError as exc:
        parser.error(str(exc))
    if args.shard is not None and args.json is None:
        parser.error("--shard: given without --json, which gmm-harness merge joins the shards from")
    if args.durations is not None and args.shard is None:
        parser.error("--durations: given without --shard, which it balances")
    try:
        large.allowed_memory()  # $GMM_LARGE_MEMORY, where set: a value that is no number of GiB is a usage error
    except ValueError as exc:
        parser.error(str(exc))
    return modes, values


def _run(args: argparse.Namespace, request: WorkRequest, kernels: dict[str, KernelAdapter], plan: list[TableCell],
         cells: list[TableCell], table: Table) -> None:
    """Check ``cells`` (all of the ``plan``, or a shard's part) into ``table``, which gets every row of the plan."""
    table.plan(plan)
    # the default run (no --kernel): a routed kernel that runs interpreted gets few examples a mode
    examples = {name: args.max_examples if args.kernel else tiers.examples_in_default_run(k, args.max_examples)
                for name, k in kernels.items()}
    by_kernel: dict[str, list[TableCell]] = {}
    for cell in cells:
        by_kernel.setdefault(cell.kernel, []).append(cell)

    def lane(name: str) -> WorkRequest:
        # the worker loads this kernel alone (another's module failing to load there is not this kernel's failure)
        return replace(request, kernels=(kernels[name].origin or name,), max_examples=examples[name],
                       deadline=time.time() + args.budget if args.budget else None)  # the kernel's budget

    if args.in_process:  # the worker's work, kernel by kernel, in this process
        for name, mine in by_kernel.items():
            compute(replace(lane(name), cells=tuple(run_order(mine))), kernels,
                    lambda event: take_event(event, table, verbose=False), contain_exits=True)
        return
    # one lane per job; a lane takes the next kernel and checks all its cells in one worker, so the shapes a
    # kernel compiled for one mode serve its other modes; each kernel fills a table of its own, merged in
    # kernel order, so the report does not depend on which lane finished first
    if not by_kernel:  # a shard with no cells
        return
    tables = {name: Table() for name in by_kernel}

    def check(name: str) -> None:
        tables[name].plan([c for c in plan if c.kernel == name])  # every row, even for a shard with the goldens alone
        Supervisor(lane(name), tables[name], args.timeout, verbose=True).run(run_order(by_kernel[name]))

    jobs = min(args.jobs or os.cpu_count() or 1, len(by_kernel))
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="gmm-lane") as lanes:
        list(lanes.map(check, by_kernel))  # an error in a lane is raised here, not lost with its thread
    for kernel_table in tables.values():
        table.merge(kernel_table)


def _shape_unit(cell: TableCell) -> tuple[Any, ...]:
    """Cells that compile the same shapes: a kernel's family in the modes whose problems differ only in their
    values (exact, normal, wide, poisoned, all_empty), else the cell alone."""
    kernel, family, column = cell
    mode = ALL_MODES.get(column)
    if mode is None:  # the goldens
        return (kernel, column)
    return (kernel, family, column if mode.changes_shapes else "the exact mode's shapes")


def _header(kernels: list[KernelAdapter], asked: str, request: WorkRequest, devices: dict[str, str]) -> str:
    """The lines above the table: the device of every kernel, declared scopes, versions, modes."""
    by = {k.convention_facts.framework: devices[k.name] for k in kernels}  # the table's column: each kernel's
    how = {"torch": f"--device {asked}", "jax": "jax's default device"}
    lines = ["devices: " + "; ".join(f"{fw} conventions on {d} ({how.get(fw, fw)})" for fw, d in sorted(by.items(),
                                                                                                     reverse=True))]
    for k in kernels:
        if k.scope is not None:
            lines.append(f"{k.name} ({k.convention}) declared scope: {k.scope.describe()}")
        if k.routed and getattr(k, "numerics", None) is not None:  # a routed function's (``--numerics``)
            lines.append(f"{k.name} ({k.convention}) declared numerics: {k.numerics.describe()}")
        how = k.interpreted() if request.kernels else None
        if how:  # a user's kernel that launches Triton kernels, here in the interpreter
            lines.append(f"{k.name} runs interpreted here ({how}): the scale and real_k modes give it their "
                         "interpreted cells; each call costs milliseconds, --modes narrows a run (docs/speed.md)")
        if k.version and request.kernel_version:
            lines.append(f"{k.name} version {k.version}: its own goldens must match bit for bit")
    if list(request.modes) != list(MODES):
        lines.append(f"modes: {', '.join(request.modes)}")
    tier = tiers.tier_of(request.tier)
    rounds = f"; rounds of new examples from seed {request.rounds_from}" if request.rounds_from is not None else ""
    lines.append(f"tier {tier.describe(request.max_examples)}{rounds}")
    return "\n".join(lines)


def _run_text(seed: int | None, budget: float | None, tier: str = tiers.DEFAULT) -> str:
    """How the examples were chosen, for the summary line (of a run, or of the merge of its shards)."""
    plan = tiers.tier_of(tier)
    how = f"seed {seed}" if seed is not None else f"{plan.profile} profile, derandomized" \
        if plan.per_cell is None else f"{plan.per_cell} example{'s' * (plan.per_cell != 1)} a cell, derandomized"
    run = f"tier {plan.name}, {how}"
    return run + (f"; then rounds of new examples for {budget:g} s a kernel" if budget else "")


def _reached_line(table: Table, tier: str) -> str:
    """What the run reached: the covering designs' cells run and their pairs of relations reached ("" where no
    cell of a design was planned: a run that stopped at its first example, or of cells built apart)."""
    (run, cells), (reached, pairs) = table.reached()
    if not cells:
        return ""
    if not pairs:  # a routed kernel's design has cells but no pairs of relations yet: nothing to say of them
        return f"tier {tier} reached {run} of {cells} cells of the covering designs (docs/coverage.md)"
    return (f"tier {tier} reached {run} of {cells} cells of the covering designs and {reached} of {pairs} pairs of "
            "relations (docs/coverage.md)")


def _json_cells(table: Table, cells: list[TableCell]) -> list[dict[str, Any]]:
    """The run's cells in plan order (the goldens once per family row), each with its text, status, seconds and
    the other fields of its :class:`CellOutcome` but its reports and coverage (the document's ``failures`` and
    ``coverage``)."""
    out = []
    for kernel, family, column in cells:
        families = [family] if family is not None else [f for (k, f) in table.rows if k == kernel]
        for f in families:
            o = table.get(TableCell(kernel, f, column))
            if o is None:  # never set: no result to write (the merge counts it as a cell nobody checked)
                continue
            fields = {k: v for k, v in o.to_json().items() if k not in ("status", "seconds", "details", "coverage")}
            out.append({"kernel": kernel, "family": f, "check": column, "status": o.status.value,
                        "verdict": o.status.verdict, "text": o.text, "seconds": round(o.seconds, 2), **fields})
    return out


def _causes(table: Table, doc: RunDocument) -> dict[str, list[dict[str, Any]]]:
    """Each kernel's distinct causes of failure over its cells (``property_tests.checks.causes.summarize``)."""
    out = {}
    for k in doc.kernels:
        records, declared = table.causes(k.name)
        found = causes.summarize(None, records, declared, k.convention)
        if found:
            out[k.name] = found
    return out


def _write_json(path: str, doc: RunDocument) -> None:
    Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)  # checked before the run
    Path(path).expanduser().write_text(json.dumps(doc.to_json(), indent=2) + "\n")


def _finish(parser: argparse.ArgumentParser, table: Table, columns: list[str], *, requested: list[str],
            seconds: float, run: str, verbose: bool, json_path: str | None, doc: RunDocument,
            partial: bool = False) -> int:
    """Print the table and its summary, write the JSON; the exit status (1: a cell failed; 2: nothing checked).
    A shard with no cells prints and writes that it checked nothing, and exits 0: the merge judges the run."""
    # a declared known bug no longer caught, where the examples are the same every run: a failure
    if not partial and doc.same_every_run and table.known_bugs_not_caught(doc.declared_bugs()):
        doc = doc.replace(cells=tuple(_json_cells(table, list(doc.plan))))  # the JSON says it too
    doc = doc.replace(causes=_causes(table, doc))
    n_fail = sum(table.count(s) for s in Status if s.failure)
    n_pass = table.count(Status.PASSED)
    if partial and doc.checked == 0 and doc.shard is not None:
        print(f"shard {doc.shard[0]}/{doc.shard[1]} checked nothing (0 of the {len(doc.plan)} cells); its "
              "--json file says so, and gmm-harness merge joins it with the other shards")
    else:
        print(render(table.as_rows(), columns))
        print(f"\n{n_pass} passed, {n_fail} failed  ({seconds:.0f} s; {run}; 'n/a' cells give their reason)")
        reached = _reached_line(table, doc.tier)
        if reached:
            print(reached)
        for kernel, found in doc.causes.items():  # one cause without a declaration: the table's note says it all
            if len(found) > 1 or any(c["declaration"] for c in found):
                print("\n" + "\n".join(causes.summary_lines(found, kernel)))
    # a shard may hold only a kernel's n/a cells: whether a kernel was checked at all is the merge's to say
    idle = [] if partial else [name for name in requested if table.checked_nothing(name)]
    if json_path:
        (run_cells, cells), (reached, pairs) = table.reached()
        _write_json(json_path, doc.replace(failures=tuple(table.details), coverage=tuple(table.coverage),
                                           passed=n_pass, failed=n_fail, seconds=seconds,
                                           checked_nothing=tuple(idle),
                                           reached={"cells": [run_cells, cells], "pairs": [reached, pairs]}))
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
    doc = document.load_shards(args.files, parser.error)
    table = Table()
    table.plan(doc.plan)
    for c in doc.cells:  # the goldens come once per family row; the reports and coverage: the document's
        try:
            table.put(TableCell(c["kernel"], c["family"], c["check"]), CellOutcome.from_json(c))
        except (ValueError, KeyError, TypeError) as exc:
            parser.error(f"a shard's cell is not a result: {type(exc).__name__}: {exc}: {c}")
    table.details, table.coverage = list(doc.failures), list(doc.coverage)
    table.devices = {k.name: k.device for k in doc.kernels if k.device}
    columns = list(doc.modes) + ([GOLDENS] if doc.goldens else [])
    run = _run_text(doc.seed, doc.budget, doc.tier)
    print(f"merged {len(doc.shards or ())} shards ({', '.join(f'{s:.0f} s' for s in doc.shard_seconds or ())})\n")
    requested = [k.name for k in doc.kernels] if doc.requested else []
    return _finish(parser, table, columns, requested=requested, seconds=doc.seconds,
                   run=f"{run}; seconds summed over the shards", verbose=args.verbose, json_path=args.json, doc=doc)


def main(argv: Sequence[str] | None = None) -> int:
    prepare_process()  # before anything imports jax or a kernel's module (workers inherit it)
    if not {"", os.getcwd()} & set(sys.path):  # as with python -m: --kernel mymodule:fn imports from here
        sys.path.insert(0, os.getcwd())
    args = _parse(_parser(), sys.argv[1:] if argv is None else list(argv))
    parser = args.command_parser  # usage errors print the command's usage
    if args.command == "coverage":
        return coverage.run(parser, args)
    _check_outputs(parser, args)
    if args.command == "merge":
        return _merge(parser, args)
    modes, scope_values = _options(parser, args)
    try:
        cache_line = prepare_process(cache=True, cache_dir=args.compile_cache, option_name="--compile-cache")
    except ValueError as exc:
        parser.error(str(exc))
    request = WorkRequest(kernels=tuple(args.kernel), convention=args.convention, tiling=args.tiling,
                          modes=tuple(modes), scope=scope_values, max_examples=args.max_examples, seed=args.seed,
                          golden_dir=None if args.golden_dir is None else str(Path(args.golden_dir).resolve()),
                          kernel_version=args.kernel_version, require_own=args.kernel_version is not None,
                          example_db=args.example_db, environ=HOST_ENVIRON, device=args.device,
                          fail_fast=args.fail_fast, tier=args.tier.name, rounds_from=args.rounds_from,
                          in_process=args.in_process)
    try:
        kernels = resolve_request(request)
    except (ValueError, TypeError, ImportError) as exc:
        parser.error(str(exc))
    request = replace(request, kernels=tuple(args.kernel or [k.name for k in kernels]))
    plan = [c for k in kernels for c in cells_of(k, goldens=not args.no_goldens, modes=request.modes)]
    cells = plan if args.shard is None else shards.assign(plan, args.shard[1], args.durations,
                                                           unit=_shape_unit)[args.shard[0] - 1]
    t0 = time.perf_counter()
    table = Table()
    devices = {k.name: device.of(k) for k in kernels}
    table.devices = devices
    header = _header(kernels, args.device_asked, request, devices)
    if args.verbose:
        header = "\n".join(filter(None, [header, cache_line, example_db.describe(args.example_db)]))
    if header or args.shard is not None:
        print("\n".join(filter(None, [header, _shard_line(args.shard, plan, cells)])) + "\n")
    _run(args, request, {k.name: k for k in kernels}, plan, cells, table)
    columns = modes + ([] if args.no_goldens else [GOLDENS])
    doc = RunDocument(
        kernels=tuple(KernelEntry(k.name, k.convention, k.available(), None if k.scope is None else k.scope.to_json(),
                                  devices[k.name],
                                  k.numerics.to_json() if k.routed and getattr(k, "numerics", None) else None,
                                  {m: bug for m in request.modes if (bug := k.known_issue(m))})
                      for k in kernels),
        modes=request.modes, plan=tuple(plan), requested=bool(args.kernel), goldens=not args.no_goldens,
        max_examples=request.max_examples, seed=request.seed, budget=args.budget, tier=request.tier,
        rounds_from=request.rounds_from, golden_dir=request.golden_dir, shard=args.shard, checked=len(cells),
        cells=tuple(_json_cells(table, cells)))
    return _finish(parser, table, columns, requested=[k.name for k in kernels] if args.kernel else [],
                   seconds=time.perf_counter() - t0, run=_run_text(args.seed, args.budget, request.tier),
                   verbose=args.verbose,
                   json_path=args.json, doc=doc, partial=args.shard is not None)


def _shard_line(shard: tuple[int, int] | None, plan: list[TableCell], cells: list[TableCell]) -> str:
    """The header line of a shard: its share of the cells, or why it has none (it still writes its --json)."""
    if shard is None:
        return ""
    i, n = shard
    if cells:
        return f"shard {i}/{n}: {len(cells)} of the {len(plan)} cells (gmm-harness merge joins the shards)"
    units = len({_shape_unit(c) for c in plan})
    return (f"shard {i}/{n}: 0 of the {len(plan)} cells (they make {units} group{'s' * (units != 1)} of cells that "
            f"compile the same shapes, each checked on one shard: fewer than the {n} shards)")


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The command line's namespace, with ``command_parser`` (the command's parser); a misspelt command or
    option is a usage error of the command, suggesting the nearest name."""
    commands = parser.get_default("commands")
    if argv and not argv[0].startswith("-") and argv[0] not in commands:
        parser.error(f"argument command: invalid choice: {argv[0]!r} (choose from {', '.join(commands)})"
                     f"{did_you_mean(argv[0], commands)}")
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = args.command_parser
        # argparse keeps its parsers' options private; the option strings are what a user could have meant
        known = [o for action in command._actions for o in action.option_strings if o.startswith("--")]
        hints = "".join(did_you_mean(e.partition("=")[0], known) for e in extra if e.startswith("-"))
        command.error(f"unrecognized arguments: {' '.join(extra)}{hints}")
    return args


def _check_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every path the run will write, checked before anything runs: a usage error naming the option and the path.
    (The example database is checked as it is opened, the compilation cache as it is enabled.)"""
    try:
        if args.json is not None:
            paths.check_output_file(args.json, "--json")
        if args.command != "check":
            return
        if os.environ.get("GMM_REPRO_DIR"):  # where reproducers save the data of large problems
            paths.check_output_dir(os.environ["GMM_REPRO_DIR"], "GMM_REPRO_DIR")
        if args.example_db is None and os.environ.get(example_db.ENV):  # the workers open it
            example_db.open_database(os.environ[example_db.ENV], option_name=example_db.ENV)
    except (ValueError, TypeError, ImportError) as exc:
        parser.error(str(exc))


if __name__ == "__main__":
    sys.exit(main())
