"""Goldens cannot be lost: concurrent and killed regenerations, side-by-side producers, full verification.

Regenerations run as separate processes here, as they do on a developer's
machine: two at once on disjoint cases, and one killed at many points while it
writes. Afterwards every golden is present and bit-identical to a sequential
run, and no temporary file is left once the next run has started.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import gmm_ref
from gmm_kernels import Status, configure, wrap
from golden.case import GoldenError
from golden.judge import check_goldens
from golden.lock import LOCK_NAME, locked
from golden.regeneration import regenerate
from golden.store import MANIFEST, REFERENCE, GoldenStore, array_sha256
from golden.verification import verify

ROOT = Path(__file__).resolve().parents[2]
CORPUS_MODULE = textwrap.dedent('''
    from golden import Case

    def _cases(prefix, seed0):
        return [Case(f"{prefix}-{i:02d}", convention="ragged_dot", family="ragged_m", m=16, k=8, n=8,
                     group_sizes=[i % 5, 3, 0, 16 - 3 - i % 5], seed=seed0 + i) for i in range(12)]

    CASES = _cases("a", 0) + _cases("b", 100)
''')
SLOW_RUNNER = textwrap.dedent('''
    import os, sys, time
    real = os.replace
    def slow_replace(src, dst):
        time.sleep(0.03)   # a window between writing a temporary file and renaming it
        return real(src, dst)
    os.replace = slow_replace
    from golden.cli import main
    sys.exit(main(sys.argv[1:]))
''')


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """A corpus module importable by subprocesses, and the same cases here."""
    (tmp_path / "rel_corpus.py").write_text(CORPUS_MODULE)
    (tmp_path / "slow_runner.py").write_text(SLOW_RUNNER)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module("rel_corpus")
    return importlib.reload(module).CASES


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _regen(tmp_path: Path, directory: Path, *extra: str, runner: str = "-m golden") -> subprocess.Popen:
    cmd = [sys.executable, *runner.split(), "regenerate", "--dir", str(directory), "--corpus", "rel_corpus:CASES",
           *extra]
    return subprocess.Popen(cmd, cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _golden_bits(directory: Path) -> dict[str, tuple[str, str]]:
    """case -> (output sha256, mask sha256) of every reference golden, read back from the files."""
    store = GoldenStore(directory)
    out = {}
    for name, key, entry in store.goldens():
        g = store.load(name, entry)
        out[f"{name} [{key}]"] = (array_sha256(g.out), array_sha256(g.mask))
    return out


@pytest.fixture
def sequential(tmp_path, corpus):
    d = tmp_path / "sequential"
    rc, text = regenerate(corpus, d, stream=io.StringIO())
    assert rc == 0, text
    return _golden_bits(d)


def test_concurrent_regenerations_of_disjoint_cases_lose_nothing(tmp_path, corpus, sequential):
    for trial in range(3):
        d = tmp_path / f"concurrent-{trial}"
        procs = [_regen(tmp_path, d, "--cases", "a-*"), _regen(tmp_path, d, "--cases", "b-*")]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        assert _golden_bits(d) == sequential, f"trial {trial}: a golden was lost or changed"
        rc, text = verify(d, corpus, stream=io.StringIO())
        assert rc == 0 and "warning" not in text, text


def test_a_second_regeneration_waits_or_names_the_holder(tmp_path, corpus):
    d = tmp_path / "held"
    with locked(d, wait=0):
        p = _regen(tmp_path, d, "--wait", "0")
        _, err = p.communicate(timeout=120)
    assert p.returncode == 2
    assert f"locked by pid {os.getpid()}" in err and "since" in err and "--wait SECONDS" in err
    with pytest.raises(GoldenError, match="locked by pid"), locked(d, wait=0), locked(d, wait=0.1):
        pass


def _kill_when(p: subprocess.Popen, d: Path, point: str) -> str:
    """SIGKILL the regeneration at a point of its run; say where it was."""
    start = {f.name for f in d.iterdir()}
    deadline = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < deadline:
        names = {f.name for f in d.iterdir()}
        new = [n for n in names - start if n.endswith(".npz")]
        temporary = any(".tmp-" in n for n in names)
        if (point == "start" or (point == "temporary" and temporary) or (point.isdigit() and len(new) >= int(point))
                or (point == "manifest" and temporary and len(new) >= 18)):
            break
        time.sleep(0.001)
    where = f"{len({f.name for f in d.iterdir()} - start)} new files" if p.poll() is None else "after it ended"
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    return where


@pytest.mark.parametrize("point", ["start", "temporary", "1", "5", "11", "17", "manifest"])
def test_a_killed_regeneration_loses_nothing_and_leaves_nothing(tmp_path, corpus, sequential, point):
    d = tmp_path / "killed"
    rc, text = regenerate(corpus[:6], d, stream=io.StringIO())  # an earlier, smaller set
    assert rc == 0, text
    before = _golden_bits(d)
    where = _kill_when(_regen(tmp_path, d, runner="slow_runner.py"), d, point)
    assert where != "after it ended" or point == "start", "the kill came too late to test anything"
    # whatever the moment: the manifest names only complete, intact goldens (the old set or the new)
    after = _golden_bits(d)
    assert after in (before, sequential) or (set(before.items()) <= set(after.items()) <= set(sequential.items()))
    # the next run completes, clears what the killed one left, and equals a sequential run
    p = _regen(tmp_path, d)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert _golden_bits(d) == sequential
    assert not [f.name for f in d.iterdir() if f.name.startswith(".") and f.name != LOCK_NAME], "temporary files"


def _np_ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    lhs, rhs, gs = np.asarray(lhs), np.asarray(rhs), np.asarray(group_sizes)
    out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float64)
    ends = np.cumsum(gs)
    for g, (s, e) in enumerate(zip(ends - gs, ends, strict=True)):
        out[s:e] = lhs[s:e].astype(np.float64) @ rhs[g].astype(np.float64)
    return gmm_ref.round_to(out, np.dtype(preferred_element_type or lhs.dtype))


def test_kernel_goldens_and_the_reference_stay_side_by_side(tmp_path, corpus):
    d = tmp_path / "both"
    assert regenerate(corpus[:3], d, stream=io.StringIO())[0] == 0
    k = configure(wrap(_np_ragged_dot, "ragged_dot", name="np-rd"), version="1")
    assert regenerate(corpus[:3], d, kernel=k, stream=io.StringIO())[0] == 0
    k2 = configure(wrap(_np_ragged_dot, "ragged_dot", name="np-rd"), version="2")
    assert regenerate(corpus[:3], d, kernel=k2, stream=io.StringIO())[0] == 0
    rc, _ = regenerate(corpus[:3], d, update=True, stream=io.StringIO())
    assert rc == 0
    goldens = GoldenStore(d).manifest()["cases"]["a-00"]
    assert len(goldens) == 3 and REFERENCE in goldens
    assert {e["producer"]["version"] for key, e in goldens.items() if key != REFERENCE} == {"1", "2"}
    assert all(r.status is Status.PASSED and r.criterion == "bit-for-bit" for r in check_goldens(k2, d))
    rc, text = verify(d, corpus[:3], stream=io.StringIO())
    assert rc == 0 and "and 6 kernel golden(s)" in text, text
    missing = configure(wrap(_np_ragged_dot, "ragged_dot", name="np-rd"), version="3")
    results = check_goldens(missing, d, require_own=True)
    assert results and all(r.status is Status.FAILED and "missing" in r.detail for r in results)


def _corruptions(entry: dict) -> list[tuple[str, dict]]:
    """One changed manifest entry per field (and per sub-field of the spec, producer and dtypes)."""
    out = []

    def changed(path: tuple, value):
        e = copy.deepcopy(entry)
        target = e
        for p in path[:-1]:
            target = target[p]
        target[path[-1]] = value
        out.append(("/".join(map(str, path)), e))

    for key in ("file_sha256", "inputs_sha256", "output_sha256", "mask_sha256"):
        changed((key,), "0" * 64)
    changed(("file",), "other-0000000000.npz")
    changed(("out_shape",), [entry["out_shape"][0] + 1, *entry["out_shape"][1:]])
    changed(("inputs_stored",), not entry["inputs_stored"])
    changed(("numerics",), {"multiply": None, "accumulate": "float32", "flush_subnormals": False})
    for key, value in (("name", "someone"), ("version", "x"), ("platform", "y")):
        changed(("producer", key), value)
    for key in ("lhs", "rhs", "out"):
        changed(("dtypes", key), "float16")
    for key, value in (("m", 17), ("k", 9), ("n", 9), ("seed", 999), ("dtype", "bfloat16"), ("kind", "int"),
                       ("group_sizes", [0, 0, 0, 16]), ("poison", True), ("tiling", [8, 8, 8]),
                       ("lhs_transposed", True), ("out_dtype", "float16"), ("convention", "torch.grouped_mm"),
                       ("name", "a-99"), ("int_range", 7), ("existing", True)):
        changed(("spec", key), value)
    changed(("numerics",), "float32")
    changed(("producer",), "reference")
    changed(("out_shape",), [*entry["out_shape"], 1])
    changed(("spec", "batch_shape"), [2])
    e = copy.deepcopy(entry)
    e["extra_field"] = 1
    out.append(("extra field", e))
    e = copy.deepcopy(entry)
    del e["dtypes"]
    out.append(("missing field", e))
    return out


def test_verify_catches_every_manifest_field_edit(tmp_path, corpus):
    d = tmp_path / "fields"
    assert regenerate(corpus[:1], d, stream=io.StringIO())[0] == 0
    man = json.loads((d / MANIFEST).read_text())
    entry = man["cases"]["a-00"][REFERENCE]
    missed, missed_alone = [], []
    corruptions = _corruptions(entry)
    for what, bad in corruptions:
        broken = copy.deepcopy(man)
        broken["cases"]["a-00"][REFERENCE] = bad
        (d / MANIFEST).write_text(json.dumps(broken))
        if verify(d, corpus[:1], stream=io.StringIO())[0] == 0:  # as python -m golden verify runs: with the corpus
            missed.append(what)
        if verify(d, stream=io.StringIO())[0] == 0 and not what.startswith("spec/"):
            missed_alone.append(what)  # without a corpus, every field but the spec is still checked
    (d / MANIFEST).write_text(json.dumps(man))
    assert verify(d, corpus[:1], stream=io.StringIO())[0] == 0
    assert len(corruptions) >= 31 and not missed and not missed_alone, (missed, missed_alone)


def test_check_reads_the_stored_reference_values(tmp_path, corpus):
    """A stored reference golden that is no longer the reference fails the kernel check, not just verify."""
    d = tmp_path / "stored"
    assert regenerate(corpus[:1], d, stream=io.StringIO())[0] == 0
    store = GoldenStore(d)
    man = store.manifest()
    entry = man["cases"]["a-00"][REFERENCE]
    g = store.load("a-00", entry)
    out = g.out.copy()
    out.flat[0] = out.flat[0] + 1
    data = GoldenStore.encode(out, g.mask)
    sha = hashlib.sha256(data).hexdigest()
    (d / f"a-00-{sha[:10]}.npz").write_bytes(data)
    man["cases"]["a-00"][REFERENCE] = dict(entry, file=f"a-00-{sha[:10]}.npz", file_sha256=sha,
                                           output_sha256=array_sha256(out))
    store.write_manifest(man["cases"])
    (result,) = check_goldens(wrap(_np_ragged_dot, "ragged_dot"), d)
    assert result.status is Status.FAILED and "no longer equals the reference" in result.detail


def test_a_manifest_in_the_old_format_is_read_and_rewritten(tmp_path, corpus):
    d = tmp_path / "old"
    assert regenerate(corpus[:2], d, stream=io.StringIO())[0] == 0
    man = json.loads((d / MANIFEST).read_text())
    old = {"format": 1, "generator": man["generator"],
           "cases": {n: g[REFERENCE] for n, g in man["cases"].items()}}
    (d / MANIFEST).write_text(json.dumps(old))
    assert verify(d, corpus[:2], stream=io.StringIO())[0] == 0
    rc, text = regenerate(corpus[:2], d, stream=io.StringIO())
    assert rc == 0 and "format 2" in text
    assert json.loads((d / MANIFEST).read_text()) == man

