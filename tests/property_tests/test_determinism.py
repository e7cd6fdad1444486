"""The same examples, so the same verdict, in every process: whatever ``PYTHONHASHSEED`` is and whatever modules the
process loaded.

Two processes draw and build everything the checks are made of (``gst.problems`` of grouped, scaled and serving
conventions, ``gst.routings`` and ``gst.routed_backwards``, the buckets of ``problems()``, the covering designs of
every drawing mode of a few kernels with an example of each cell, the ``scale`` cells, grouped and routed, the
reason of a cell whose examples were all declined) under the harness's pin of Hypothesis' local constants
(``profiles.pinned_constants``), one with another hash seed and a local module of literals imported, as a kernel
repository's modules are; everything must be equal. Two twins show that the comparison sees what it guards against:
a strategy sampling a set of strings (its order follows the hash seed) and ``gst.problems`` drawn without the pin
(the literals reach Hypothesis' draws) must differ. The main job is held to it end to end: a kernel that records
every input it is given gets the same ones from two runs with different hash seeds, one of them from a module of
literals (docs/speed.md, "The same examples in every process").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: a module of literals Hypothesis would draw from: ints >= 100 and floats, as a kernel's tables and limits are
LITERALS = ("BLOCKS = (" + ", ".join(str(100 + 7 * i) for i in range(200)) + ")\n"
            "SCALES = (" + ", ".join(repr(0.5 + i / 64) for i in range(1, 64)) + ")\n"
            "LIMITS = (65535, 65536, 2**31 - 1, 1 << 40, 0.001, 1e-6, 448.0, 57344.0)\n")

DRAW = textwrap.dedent('''
    import dataclasses, hashlib, json, sys
    import numpy as np
    from hypothesis import given, seed, settings, strategies as st
    if sys.argv[1] != "-":
        sys.path.insert(0, sys.argv[1])
        import gmm_literals  # noqa: F401  (a local module: Hypothesis collects its literals)
    from gmm_kernels import get
    from property_tests import strategies as gst
    from property_tests.checks import check as checking
    from property_tests.checks import modes
    from property_tests.checks import scale
    from property_tests.checks import scale_routed
    from property_tests.checks import tally as tally_module
    from property_tests.checks.profiles import pinned_constants, profile
    from property_tests.strategies.problems import buckets
    from property_tests.strategies.problems import _drawer, _no_draw

    def feed(x, h):
        if isinstance(x, np.ndarray):
            h.update(f"{x.dtype} {x.shape}".encode() + np.ascontiguousarray(x).tobytes())
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                h.update(f.name.encode())
                feed(getattr(x, f.name), h)
        elif isinstance(x, (tuple, list)):
            for y in x:
                feed(y, h)
        else:
            h.update(repr(x).encode())

    def digest(*xs):
        h = hashlib.sha256()
        for x in xs:
            feed(x, h)
        return h.hexdigest()[:16]

    def drawn(strategy, n, at=1):
        got = []
        @seed(at)  # as check_mode runs a cell of the gmm-ci profile: a seed of its own, no database
        @settings(profile("gmm-ci"), max_examples=n, derandomize=False, database=None)
        @given(strategy)
        def record(x):
            got.append(x)
        record()
        return digest(got) + f" ({len(got)})"

    out = {}
    levels = tuple({f"level{i}" for i in range(16)})  # the twin: a set of strings, in the hash seed's order
    out["twin: a set of strings"] = drawn(st.sampled_from(levels), 10)
    # the other twin, first: Hypothesis' cache of permitted constants now holds this process's literals
    unpinned = drawn(gst.problems(convention="ragged_dot"), 30)
    out["twin: gst.problems unpinned"] = unpinned
    with pinned_constants():
        with pinned_constants():  # nested, as check_kernel runs check_mode: leaving it must not unpin
            pass
        for conv in (None, "ragged_dot", "megablox.gmm", "torch.grouped_mm", "qwix.ragged_dot",
                     "torch.scaled_grouped_mm", "te.scaled_grouped_gemm", "deep_gemm.m_grouped_contiguous",
                     "vllm.batched_moe"):
            out[f"gst.problems {conv}"] = drawn(gst.problems(convention=conv), 30)
            out[f"buckets {conv}"] = digest(buckets(_drawer(convention=conv).config(_no_draw)))
        out["gst.routings"] = drawn(gst.routings(), 30)
        out["gst.routed_backwards"] = drawn(gst.routed_backwards(gst.routings()), 10)
        for name in ("jax.ragged_dot", "megablox.gmm", "qwix.ragged_dot[slow]"):
            adapter = get(name)
            for mode in modes.MODES.values():
                if not mode.draws_examples:
                    continue
                try:
                    cov = modes.mode_covering(adapter, mode)
                except Exception as exc:  # n/a: its reason must not differ either
                    out[f"{name} {mode.name}"] = f"{type(exc).__name__}: {exc}"
                    continue
                out[f"{name} {mode.name} cells"] = digest([f"{c.family} {c.cell.describe()}" for c in cov.cells])
                out[f"{name} {mode.name} draws"] = digest([drawn(c.strategy, 1, i) for i, c in enumerate(cov.cells)])
        for name in ("jax.ragged_dot_general", "megablox.gmm", "vllm.batched_moe"):
            adapter = get(name)
            out[f"{name} scale"] = digest([scale.scale_problem(adapter, c) for c in scale.cells(adapter)])
        for name in ("vllm.fused_moe", "torch.moe_experts", "unsloth.grouped_gemm_dW"):
            adapter = get(name)
            if adapter.available() is not None:  # its routings are checked only where it runs (torch, a wheel)
                continue
            out[f"{name} scale"] = digest([scale_routed.scale_routing(adapter, c) for c in scale_routed.cells(adapter)])
    # the reason an n/a cell gives when a kernel declined every example: the most frequent, here all tied
    tally = tally_module.Tally()
    tally.declined = [f"declines it: reason {c}" for c in "abcdefghijkl"]
    try:
        tally.conclude(get("jax.ragged_dot"), "problem")
    except modes.Unsupported as exc:
        out["declined every problem"] = str(exc)
    # unpinned again, Hypothesis' own pool is back (and nothing drawn under the pin stayed in its cache)
    assert drawn(gst.problems(convention="ragged_dot"), 30) == unpinned, "the pin was not undone"
    print(json.dumps(out))
''')


def _environ(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra}


def _draw(tmp_path: Path, hash_seed: str, literals: bool) -> dict[str, str]:
    tmp_path.mkdir()
    where = "-"
    if literals:
        (tmp_path / "gmm_literals.py").write_text(LITERALS)
        where = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", DRAW, where], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=_environ(PYTHONHASHSEED=hash_seed))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_hypothesis_whose_pool_the_pin_cannot_find_gets_a_warning_once_never_an_error(monkeypatch):
    from property_tests.checks import profiles

    # as a Hypothesis release that moved the function would be (raising=True: this fails first if it moved)
    monkeypatch.delattr("hypothesis.internal.conjecture.providers._get_local_constants")
    monkeypatch.setattr(profiles, "_warned", [])
    with pytest.warns(RuntimeWarning, match="examples drawn may depend on the modules loaded"), \
            profiles.pinned_constants():
        pass
    with warnings.catch_warnings():  # once per process
        warnings.simplefilter("error")
        with profiles.pinned_constants():
            pass


def test_the_examples_do_not_depend_on_the_hash_seed_or_the_modules_loaded(tmp_path):
    pytest.importorskip("jax", reason="the covering designs of jax kernels' modes are drawn")
    plain = _draw(tmp_path / "plain", "1", literals=False)
    other = _draw(tmp_path / "other", "2", literals=True)
    assert plain.keys() == other.keys()
    twins = [k for k in plain if k.startswith("twin")]
    assert len(plain) - len(twins) > 60, sorted(plain)  # every line below compares something
    differ = [f"{k}: {plain[k]} != {other[k]}" for k in plain if k not in twins and plain[k] != other[k]]
    assert not differ, "drawn or built differently in two processes:\n" + "\n".join(differ)
    # the comparison sees both dependencies: without sorting, and without the pin, the draws differ
    assert plain["twin: a set of strings"] != other["twin: a set of strings"]
    assert plain["twin: gst.problems unpinned"] != other["twin: gst.problems unpinned"], (
        "drawn without the pin, the module of literals changed nothing: this Hypothesis no longer mixes local "
        "constants into its draws (or collects them where the pin does not look, and warned): see docs/speed.md")


KERNEL = textwrap.dedent('''
    import hashlib, os
    import numpy as np
    import gmm_ref

    def ragged(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        """A right kernel (the reference, in NumPy) that records every input it is given."""
        args = [np.asarray(a) for a in (lhs, rhs, group_sizes)]
        with open(os.environ["GMM_TEST_CALLS"], "a") as log:
            log.write(hashlib.sha256(b"".join(f"{a.dtype} {a.shape}".encode() + a.tobytes()
                                              for a in args)).hexdigest()[:16] + "\\n")
        return gmm_ref.ragged_dot(*args, preferred_element_type=preferred_element_type)
''')


def _main_job(where: Path, hash_seed: str, literals: bool, cache: Path) -> tuple[list[str], dict]:
    where.mkdir()
    (where / "kern.py").write_text(KERNEL + (("\n# a kernel module's tables\n" + LITERALS) if literals else ""))
    calls = where / "calls.txt"
    proc = subprocess.run([sys.executable, "-m", "property_tests.cli.main", "check", "--kernel", "kern:ragged",
                           "--convention", "ragged_dot", "--modes", "exact,scale", "--no-goldens",
                           "--max-examples", "300", "--compile-cache", str(cache), "--json", str(where / "r.json")],
                          capture_output=True, text=True, timeout=600, cwd=where,
                          env=_environ(PYTHONHASHSEED=hash_seed, GMM_TEST_CALLS=str(calls),
                                       PYTHONPATH=os.pathsep.join([str(where), str(ROOT)])))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((where / "r.json").read_text())
    cells = [(c["check"], c["text"], c["examples"], c["cells"]) for c in doc["cells"]]
    return calls.read_text().split(), {"cells": cells, "coverage": doc["coverage"]}


def test_the_main_job_gives_a_kernel_the_same_inputs_whatever_the_hash_seed_and_its_modules(tmp_path):
    pytest.importorskip("jax", reason="the ragged_dot convention hands the kernel jax arrays")
    calls, table = _main_job(tmp_path / "plain", "1", False, tmp_path / "cache")
    again, other = _main_job(tmp_path / "literals", "2", True, tmp_path / "cache")
    assert [c[:2] for c in table["cells"]] == [("exact", "pass (300)"), ("scale", "pass (7)")], table["cells"]
    assert len(calls) > 600, len(calls)  # exact runs each problem twice; the scale cells once each
    assert table == other
    first = next((i for i, (a, b) in enumerate(zip(calls, again, strict=False)) if a != b), None)
    assert len(calls) == len(again) and first is None, \
        f"the kernel's inputs differ from call {first} on ({len(calls)} and {len(again)} calls)"
