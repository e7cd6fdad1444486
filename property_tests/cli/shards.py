"""Split the main job across CI machines (``--shard I/N``) and merge the shards' results (``gmm-harness merge``).

Every shard computes the same plan, every ``(kernel, family, column)`` cell of
the run in table order, and takes its part of it. Cells that compile the same
shapes stay on one shard (the main job's unit: a kernel's family and the
shapes its mode draws, so exact, normal, wide, poisoned and all_empty go
together), and the units are dealt longest first to the shard with the least
work so far, a cell's work being its seconds in a previous run's ``--json``
given with ``--durations`` (the same file on every shard), else one. The partition depends only on the plan,
N and that file, so the N shards check every cell exactly once, and a shard
prints and writes (``--json``) only its own cells. A shard may have none (a run
with fewer groups of cells than shards, in a CI matrix whose shard count is
fixed): it writes a shard file that says it checked nothing and exits 0, and
the merge decides whether the run checked anything.

``gmm-harness merge A.json B.json ...`` reads the shards' ``--json`` files
(``property_tests.cli.document.load_shards``),
checks that they are the N shards of one plan (a missing, repeated or foreign
shard is an error, an empty shard's file too is needed: cells nobody checked
are never a pass), prints the whole table and exits as the unsharded run would
have: 1 if a cell failed, 2 if nothing was checked for a kernel asked for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["TableCell", "assign", "load_durations", "parse_shard", "plan_key"]


class TableCell(NamedTuple):
    """A table cell: a kernel's family in a column (a mode, or the goldens, whose family is None). A tuple: it
    equals ``(kernel, family, column)`` and is written to JSON as a list."""

    kernel: str
    family: str | None
    column: str


_GOLDENS = "goldens"  # the goldens column (property_tests.cli.table.GOLDENS, not imported: this module stays light)
_SHARD = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


def parse_shard(text: str, *, option_name: str = "--shard") -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)`` with 1 <= I <= N; ``ValueError`` naming the option otherwise."""
    m = _SHARD.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{option_name}: expected I/N (this machine's shard of N, counting from 1), got {text!r}")
    i, n = int(m.group(1)), int(m.group(2))
    if not 1 <= i <= n:
        raise ValueError(f"{option_name}: expected 1 <= I <= N in I/N, got {text!r}")
    return i, n


def plan_key(cell: Sequence[Any]) -> str:
    """A cell as one string (a JSON key): ``kernel / family / column``; the goldens are one cell per kernel
    (the JSON lists them once per family row)."""
    kernel, family, column = cell
    return f"{kernel} / {'-' if column == _GOLDENS or family is None else family} / {column}"


def load_durations(path: str, *, option_name: str = "--durations") -> dict[str, float]:
    """Seconds per cell (by :func:`plan_key`) from a previous run's ``--json`` (or a merged one)."""
    try:
        doc = json.loads(Path(path).read_text())
        cells = doc["cells"]
        return {plan_key((c["kernel"], c["family"], c["check"])): float(c["seconds"])
                for c in cells if c.get("seconds") is not None}
    except FileNotFoundError:
        raise ValueError(f"{option_name}: no such file {path!r}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{option_name}: expected the --json file of an earlier gmm-harness check, got {path!r} "
                         f"({type(exc).__name__}: {exc})") from None


def assign(cells: Sequence[TableCell], n: int, durations: dict[str, float] | None = None,
           unit: Callable[[TableCell], Any] | None = None) -> list[list[TableCell]]:
    """The cells of each of ``n`` shards, each in plan order. Cells with the same ``unit(cell)`` (default: each
    its own) stay together; units go longest first to the least-loaded shard (ties: the lower shard). A cell
    without a recorded duration weighs the median of the recorded ones (one without any)."""
    durations = durations or {}
    known = sorted(durations[plan_key(c)] for c in cells if plan_key(c) in durations)
    default = known[len(known) // 2] if known else 1.0
    units: dict[Any, list[int]] = {}
    for i, c in enumerate(cells):
        units.setdefault(unit(c) if unit is not None else i, []).append(i)
    weight = {u: sum(max(durations.get(plan_key(cells[i]), default), 1e-3) for i in members)
              for u, members in units.items()}
    load = [0.0] * n
    owner = [0] * len(cells)
    for u in sorted(units, key=lambda u: (-weight[u], units[u][0])):
        s = min(range(n), key=lambda s: (load[s], s))
        for i in units[u]:
            owner[i] = s
        load[s] += weight[u]
    return [[c for c, o in zip(cells, owner, strict=True) if o == s] for s in range(n)]
