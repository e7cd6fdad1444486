"""The order a ``gmm-quick`` run checks a mode's cells in (``property_tests.checks.cell_order.RELATION_WEIGHTS``),
measured on the project's broken-kernel corpus (a script, not a test; about 15 minutes on 2 cores).

    python benchmarks/cell_order.py [--conventions ragged_dot,...] [--jsonl FILE] [--from FILE]

Each broken kernel of ``tests/corpus/broken_kernels.py`` (``BROKEN`` and ``BROKEN_GRADIENTS``) runs, in
every mode that draws examples, on the one example ``gmm-quick`` gives every cell of the mode's covering design
(the same seed and settings, no shrinking), and each cell's verdict is recorded; a kernel whose convention
cannot run here is left out and named. A cell's *catches* are the broken kernels of its convention it caught.
A relation's weight is its lift: over the cells holding it, the mean of (the cell's catches less the mean of
its (convention, mode, family)'s cells), averaged over those designs alike. Printed: the weights (the table to
paste into ``property_tests/checks/cell_order.py``) and, per (kernel, mode) that fails somewhere, how many cells run
before the first failing one in the design's order and in the weighted order. ``--jsonl`` appends every
cell's verdict as it is found; ``--from`` reads such a file instead of running the kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _property(adapter, mode, verdict: dict, check_example):
    from hypothesis import assume

    first = [True]

    def prop(problem):
        if first and first.pop():  # as gmm-quick does: its one example is a drawn one, not Hypothesis' simplest
            assume(False)
        why = next((r for r in map(adapter.supports, problem) if r is not None), None)
        if why is not None:
            verdict["declined"] = why
            return
        check_example(adapter, mode, problem)

    return prop


def cell_verdicts(adapter, mode) -> list[dict]:
    """One row per cell of ``mode``'s design: its family, place, relations and whether its example failed."""
    from hypothesis import Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.errors import InvalidArgument

    from gmm_kernels.sandbox import cuda_graph
    from property_tests.checks.check import check_example
    from property_tests.checks.modes import mode_covering
    from property_tests.checks.tiers import cell_settings
    from property_tests.strategies.problems import replays

    cov = mode_covering(adapter, mode)
    rows = []
    for i, cc in enumerate(cov.cells):
        verdict = {"family": cc.family, "cell": i, "relations": [f"{f}={v}" for f, v in cc.cell.levels]}
        prop = _property(adapter, mode, verdict, check_example)
        cell = f"gmm-harness {adapter.name} {adapter.convention} {mode.name} {cc.family} {cc.cell.describe()}"
        base = cell_settings("gmm-quick", 1, True, None, cell)
        test = settings(base, phases=[Phase.generate])(hypothesis_seed(
            zlib.crc32(f"{cc.family} {cc.cell.describe()}".encode()) ^ i)(given(problem=replays(cov, cc,
                                                                                              mode.replays))(prop)))
        try:
            test()
            verdict["failed"] = False
        except InvalidArgument:
            raise  # the harness's, not the kernel's
        except (NotImplementedError, cuda_graph.NotCapturable) as exc:
            verdict.update(failed=False, declined=str(exc)[:200])
        except Exception as exc:  # noqa: BLE001 - whatever the kernel got wrong is a catch
            verdict.update(failed=True, why=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
        rows.append(verdict)
    return rows


def measure(conventions: set[str] | None, jsonl: str | None) -> list[dict]:
    import gmm_ref
    from gmm_kernels import resolve_kernel
    from property_tests.checks.modes import MODES, Unsupported
    from tests.corpus.broken_kernels import BROKEN, BROKEN_GRADIENTS

    corpus = [(c, fn) for group in (BROKEN, BROKEN_GRADIENTS) for c, fns in group.items() for fn in fns
              if conventions is None or c in conventions]
    rows = []
    for convention, fn in corpus:
        t0 = time.perf_counter()
        try:
            __import__(gmm_ref.conventions.get(convention).framework)
            adapter = resolve_kernel(fn, convention=convention)
            why = adapter.available()
        except (ImportError, ValueError) as exc:
            why = str(exc)
        if why:
            print(f"left out {fn.__name__} ({convention}): {why}", file=sys.stderr)
            continue
        caught = 0
        for mode in (m for m in MODES.values() if m.draws_examples):
            try:
                cells = cell_verdicts(adapter, mode)
            except Unsupported:
                continue
            except Exception as exc:  # noqa: BLE001 - the strategies cannot draw this mode here: no cells
                print(f"  {fn.__name__} / {mode.name}: no cells ({type(exc).__name__}: {exc})", file=sys.stderr)
                continue
            for c in cells:
                c.update(convention=convention, kernel=fn.__name__, mode=mode.name)
                caught += c["failed"]
            rows += cells
            if jsonl:
                with open(jsonl, "a") as out:
                    out.writelines(json.dumps(c) + "\n" for c in cells)
        print(f"{convention}:{fn.__name__}: {caught} failing cells ({time.perf_counter() - t0:.1f} s)", flush=True)
    return rows


def weights(rows: list[dict]) -> dict[str, float]:
    """Each relation's lift in broken kernels caught per cell (see the module's docstring)."""
    catches: dict[tuple, int] = defaultdict(int)
    relations: dict[tuple, list[str]] = {}
    for r in rows:
        key = (r["convention"], r["mode"], r["family"], r["cell"])
        catches[key] += r["failed"]
        relations[key] = r["relations"]
    groups: dict[tuple, list[tuple]] = defaultdict(list)
    for key in relations:
        groups[key[:3]].append(key)
    lifts: dict[str, dict[tuple, list[float]]] = defaultdict(lambda: defaultdict(list))
    for group, keys in groups.items():
        mean = sum(catches[k] for k in keys) / len(keys)
        for k in keys:
            for rel in relations[k]:
                lifts[rel][group].append(catches[k] - mean)
    out = {rel: sum(sum(v) / len(v) for v in by.values()) / len(by) for rel, by in lifts.items()}
    return {rel: round(w, 3) for rel, w in sorted(out.items(), key=lambda kv: -kv[1]) if abs(w) >= 0.005}


def first_failures(rows: list[dict], table: dict[str, float], held_out: bool = False) -> tuple[float, float, int]:
    """Mean cells run up to and including the first failing one, in the design's order and in the weighted
    order, over the (kernel, mode) pairs that fail in some cell; and how many pairs that is. ``held_out``: each
    kernel's cells ordered by the weights of the other kernels' verdicts alone (a bug class the corpus lacked)."""
    by: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        by[(r["convention"], r["kernel"], r["mode"])].append(r)
    others: dict[tuple, dict[str, float]] = {}
    plain, weighted, n = 0, 0, 0
    for (convention, kernel, _), cells in by.items():
        if not any(c["failed"] for c in cells):
            continue
        n += 1
        if held_out and (convention, kernel) not in others:
            others[(convention, kernel)] = weights([r for r in rows if (r["convention"], r["kernel"]) !=
                                                    (convention, kernel)])
        w = others[(convention, kernel)] if held_out else table
        cells.sort(key=lambda c: (c["family"], c["cell"]))
        plain += next(i for i, c in enumerate(cells) if c["failed"]) + 1
        ranked = sorted(cells, key=lambda c: -sum(w.get(rel, 0.0) for rel in c["relations"]))
        weighted += next(i for i, c in enumerate(ranked) if c["failed"]) + 1
    return plain / max(n, 1), weighted / max(n, 1), n


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--conventions", default=None, help="only these conventions (comma-separated)")
    parser.add_argument("--jsonl", default=None, help="append every cell's verdict to this file")
    parser.add_argument("--from", dest="source", default=None, help="read the verdicts from this file instead")
    args = parser.parse_args()
    if args.source:
        rows = [json.loads(line) for line in Path(args.source).read_text().splitlines() if line.strip()]
    else:
        rows = measure(None if args.conventions is None else set(args.conventions.split(",")), args.jsonl)
    table = weights(rows)
    kernels = {(r["convention"], r["kernel"]) for r in rows}
    caught = {(r["convention"], r["kernel"]) for r in rows if r["failed"]}
    print(f"\n{len(rows)} cells of {len(kernels)} broken kernels; {len(caught)} caught in some cell")
    plain, ordered, n = first_failures(rows, table)
    _, held, _ = first_failures(rows, table, held_out=True)
    print(f"cells run to the first failure, mean over the {n} (kernel, mode) that fail: design order {plain:.1f}, "
          f"weighted order {ordered:.1f} (each kernel ordered by the other kernels' weights alone: {held:.1f})")
    print("\nRELATION_WEIGHTS: dict[str, float] = {")
    for rel, w in table.items():
        print(f"    {rel!r}: {w},")
    print("}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
