"""Golden outputs: every available kernel against them, and the tooling that keeps them honest.

Checks run against this repository's ``golden/data`` when the tests run from a
checkout (skipped otherwise); the tooling tests work on copies in tmp_path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import shlex
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import gmm_ref
import golden.regeneration
from gmm_kernels import Status, configure, resolve_kernel, wrap
from golden import generator
from golden.case import Case, build_problem
from golden.cli import main as golden_main
from golden.judge import check_goldens
from golden.lock import LOCK_NAME
from golden.regeneration import regenerate
from golden.store import MANIFEST, GoldenStore, array_sha256
from golden.verification import verify
from property_tests.kernel_checks import test_kernel_matches_goldens  # noqa: F401 - collected here: each kernel vs the goldens

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "golden" / "data"
HAVE_DATA = (DATA / MANIFEST).exists()
needs_data = pytest.mark.skipif(not HAVE_DATA, reason="no golden/data here (not a gmm-harness checkout)")


def _corpus() -> list[Case]:
    from golden.cases import CASES

    return list(CASES)


def _manifest_cases() -> dict:
    return GoldenStore(DATA).manifest()["cases"] if HAVE_DATA else {}


# ----------------------------------------------------------------- kernels vs goldens
def _lax_ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """A user kernel in the ragged_dot convention (checked through the pkg.mod:fn path)."""
    import jax

    return jax.lax.ragged_dot(lhs, rhs, group_sizes, precision=precision,
                              preferred_element_type=preferred_element_type)


LOCAL_KERNEL = "tests.golden.test_goldens:_lax_ragged_dot"


@needs_data
def test_user_function_matches_goldens():
    """The pkg.module:fn path: a user kernel resolved by import path."""
    pytest.importorskip("jax")
    k = resolve_kernel(LOCAL_KERNEL, convention="ragged_dot")
    results = check_goldens(k, DATA)
    assert results and all(r.status is Status.PASSED for r in results), [r.line() for r in results]


def _kernel(fn, convention, name=None, version=None):
    return configure(wrap(fn, convention, name=name), version=version)


# ------------------------------------------------------------------- verification
@needs_data
def test_reference_reproduces_the_stored_goldens_bit_for_bit():
    rc, text = verify(DATA, _corpus())
    assert rc == 0, text
    assert "warning" not in text, text


@needs_data
def test_corpus_covers_every_family_convention_and_edge_class():
    corpus = _corpus()
    fams = {c.family for c in corpus}
    assert fams == set(gmm_ref.FAMILIES) | set(gmm_ref.families.routed_names())
    # every convention has cases, the routed ones of every output (per slot, combined, the gradients) included
    from golden.routed import output_of

    outputs = {gmm_ref.conventions.get(n).output for n in gmm_ref.conventions.routed_names()}
    assert {output_of(c) for c in corpus if c.convention in gmm_ref.conventions.routed_names()} == outputs
    assert {"slots", "combined", "d_slots", "d_experts"} <= outputs
    assert {c.convention for c in corpus} == set(gmm_ref.conventions.names()) | set(gmm_ref.conventions.routed_names())
    tags = {t for c in corpus for t in c.tags}
    for t in ("empty_first", "empty_middle", "empty_last", "all_empty", "unaligned", "tail", "sharded",
              "existing", "exact", "poison", "transposed", "packed", "batch_dims"):
        assert t in tags, t
    assert {"float32", "bfloat16", "float16", "int8"} <= {c.dtype for c in corpus}
    size = sum(p.stat().st_size for p in DATA.iterdir())
    assert size < 2_000_000, f"golden/data is {size} bytes"
    for c in corpus:  # the kernel constraints the cases promise to respect
        p = build_problem(c)
        if c.convention == "megablox.gmm":
            assert c.tiling and p.m % c.tiling[0] == 0, c.name
        if c.convention == "torch.grouped_mm":
            for arr in (p.lhs, p.rhs, gmm_ref.reference(p).values):
                assert arr.shape[-1] * arr.dtype.itemsize % 16 == 0, c.name


def _small_corpus() -> list[Case]:
    return [
        Case("a-rd", convention="ragged_dot", family="ragged_m", m=8, k=4, n=4,
                group_sizes=[3, 0, 4], seed=1),
        Case("b-gmm-bf16", convention="megablox.gmm", family="ragged_m", m=8, k=4, n=4,
                group_sizes=[2, 5], dtype="bfloat16", tiling=(8, 4, 4), seed=2),
        Case("c-tgmm", convention="megablox.tgmm", family="ragged_k", m=4, k=8, n=4,
                group_sizes=[0, 6, 2], tiling=(8, 4, 4), seed=3),
    ]


@pytest.fixture
def small(tmp_path):
    d = tmp_path / "goldens"
    rc, text = regenerate(_small_corpus(), d, stream=io.StringIO())
    assert rc == 0, text
    return d


def _snapshot(d: Path) -> dict[str, str]:
    """The golden data of a directory (its lock file is no golden)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.name != LOCK_NAME}


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_corrupted_or_truncated_file_is_detected(small, damage):
    man = GoldenStore(small).manifest()
    victim = small / man["cases"]["b-gmm-bf16"]["reference"]["file"]
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[-40] ^= 0x01
        victim.write_bytes(bytes(data))
    elif damage == "truncate":
        victim.write_bytes(bytes(data[: len(data) // 2]))
    else:
        victim.unlink()
    rc, text = verify(small, _small_corpus(), stream=io.StringIO())
    assert rc == 1
    assert "golden verify FAILED" in text and victim.name in text
    assert ("corrupted or truncated" in text) if damage != "delete" else ("missing" in text)
    (res,) = check_goldens(_kernel(_np_gmm_correct, "megablox.gmm"), small, cases="b-gmm-bf16")
    assert res.status is Status.FAILED and "golden unusable" in res.detail


def test_a_corrupted_manifest_is_detected(small):
    (small / MANIFEST).write_text('{"format": 1, "cases": {')
    rc, text = verify(small)
    assert rc == 1 and "unreadable manifest" in text


def test_verify_detects_reference_drift(small):
    # a stored golden that the reference no longer reproduces (same hashes, other bits)
    store = GoldenStore(small)
    man = store.manifest()
    g = store.load("a-rd", man["cases"]["a-rd"]["reference"])
    out = g.out.copy()
    out[0, 0] = np.nextafter(out[0, 0], np.float32(np.inf))
    rc, text = regenerate(_small_corpus(), small, stream=io.StringIO())  # unchanged: a no-op
    assert rc == 0 and "up to date" in text
    data = GoldenStore.encode(out, g.mask)
    sha = hashlib.sha256(data).hexdigest()
    entry = dict(man["cases"]["a-rd"]["reference"], file=f"a-rd-{sha[:10]}.npz", file_sha256=sha,
                 output_sha256=array_sha256(out))
    (small / entry["file"]).write_bytes(data)
    man["cases"]["a-rd"]["reference"] = entry
    import json
    (small / MANIFEST).write_text(json.dumps(man))
    rc, text = verify(small)
    assert rc == 1
    assert "a-rd: the reference no longer reproduces its golden bit for bit: 1 element(s) differ" in text
    assert "max 1 ulps" in text and "--update" in text


# ------------------------------------------------------------------- regeneration
@pytest.mark.parametrize("where", ["os.replace", "write loop"])
def test_an_interrupted_regeneration_loses_nothing(small, monkeypatch, where):
    before = _snapshot(small)
    changed = [dataclasses.replace(c, seed=c.seed + 100) for c in _small_corpus()]
    calls = {"n": 0}

    class Interrupted(Exception):
        pass

    if where == "os.replace":
        real = os.replace

        def replace(src, dst):
            calls["n"] += 1
            if calls["n"] == 2:
                raise Interrupted("power cut")
            return real(src, dst)

        monkeypatch.setattr(os, "replace", replace)
    else:
        real_write = golden.regeneration.atomic_write

        def write(path, data):
            calls["n"] += 1
            if calls["n"] == 3:
                raise Interrupted("killed")
            return real_write(path, data)

        monkeypatch.setattr(golden.regeneration, "atomic_write", write)
    with pytest.raises(Interrupted):
        regenerate(changed, small, update=True, stream=io.StringIO())
    monkeypatch.undo()
    after = _snapshot(small)
    assert {n: h for n, h in after.items() if n in before} == before  # nothing overwritten
    assert not [n for n in after if n.startswith(".")], "temporary files left behind"  # (the run cleaned up)
    rc, text = verify(small, _small_corpus(), stream=io.StringIO())
    assert rc == 0, text
    # the next run completes, and clears what the interrupted one left
    rc, text = regenerate(changed, small, update=True, stream=io.StringIO())
    assert rc == 0, text
    rc, text = verify(small, changed, stream=io.StringIO())
    assert rc == 0 and "warning" not in text, text


def test_changing_a_golden_needs_update(small, capsys):
    before = _snapshot(small)
    changed = _small_corpus()
    changed[1] = dataclasses.replace(changed[1], group_sizes=[3, 5])
    rc = golden_main(["regenerate", "--dir", str(small)], corpus=changed, prog="python -m golden")
    err = capsys.readouterr().err
    assert rc == 1
    assert _snapshot(small) == before
    assert "1 existing golden(s) would change; nothing was written." in err
    assert f"run: python -m golden regenerate --cases b-gmm-bf16 --update --dir {small}" in err
    row = next(line for line in err.splitlines() if line.startswith("b-gmm-bf16"))
    # new inputs: the old golden is another problem's output, so no bound applies (it used to say "yes" regardless)
    assert "changed (spec, inputs)" in row and row.rstrip().endswith("-")
    assert "'-': the inputs changed" in err
    rc = golden_main(["regenerate", "--dir", str(small), "--update"], corpus=changed, prog="python -m golden")
    assert rc == 0
    rc, text = verify(small, changed, stream=io.StringIO())
    assert rc == 0 and "warning" not in text, text
    assert sum(p.suffix == ".npz" for p in small.iterdir()) == 3


def test_new_cases_are_added_without_update(small):
    more = [*_small_corpus(),
            Case("d-torch", convention="torch.grouped_mm", family="batch", m=4, k=4, n=4, groups=2, seed=9)]
    rc, text = regenerate(more, small, stream=io.StringIO())
    assert rc == 0 and "new: 1 case(s): d-torch" in text


# ------------------------------------------------------------- kernels and goldens
def _np_gmm_correct(lhs, rhs, group_sizes, preferred_element_type=np.float32, tiling=None,
                    group_offset=None, existing_out=None, transpose_rhs=False):
    lhs, rhs, group_sizes = np.asarray(lhs), np.asarray(rhs), np.asarray(group_sizes)  # jax arrays arrive
    ends = np.cumsum(group_sizes)
    out = np.zeros((lhs.shape[0], rhs.shape[-1]), np.float32)
    for g, (s, e) in enumerate(zip(ends - group_sizes, ends, strict=True)):
        out[s:e] = lhs[s:e].astype(np.float32) @ rhs[g].astype(np.float32)
    return out.astype(preferred_element_type)


def _np_ragged_dot_off_by_one(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """Broken: every group boundary is read one row late (the first row of a group uses the
    previous group's weights)."""
    lhs, rhs, group_sizes = np.asarray(lhs), np.asarray(rhs), np.asarray(group_sizes)  # jax arrays arrive
    ends = np.cumsum(group_sizes)
    starts = ends - group_sizes
    out = np.zeros((lhs.shape[0], rhs.shape[-1]), np.float64)
    for g in range(len(group_sizes)):
        s = starts[g] + (1 if g and group_sizes[g] else 0)
        out[s:ends[g]] = lhs[s:ends[g]].astype(np.float64) @ rhs[g].astype(np.float64)
        if s > starts[g]:
            out[starts[g]] = lhs[starts[g]].astype(np.float64) @ rhs[g - 1].astype(np.float64)
    dt = np.dtype(lhs.dtype if preferred_element_type is None else preferred_element_type)
    return np.rint(out).astype(dt) if np.issubdtype(dt, np.integer) else gmm_ref.round_to(out, dt)


@needs_data
def test_a_broken_kernel_is_rejected_naming_the_case_and_the_group():
    broken = _kernel(_np_ragged_dot_off_by_one, "ragged_dot", name="off_by_one")
    results = {r.check: r for r in check_goldens(broken, DATA)}
    r = results["rd-f32-empty-first-middle"]  # sizes [0, 7, 0, 17]
    assert r.status is Status.FAILED
    assert r.detail.startswith("case rd-f32-empty-first-middle: 16 / 192 defined elements wrong in "
                               "group 1 (rows [0, 7), size 7), group 3 (rows [7, 24), size 17); first at [0, 0]: ")
    assert "Not equal under |actual - exact| <= bound" in r.detail
    assert results["rd-f32-g1-tail"].status is Status.PASSED  # one group: no boundary to get wrong
    # the same through the command line: nonzero, one line per (kernel, case)
    assert any(x.status is Status.FAILED for x in results.values())


def test_bit_for_bit_when_the_golden_is_the_kernels_own(tmp_path):
    corpus = [c for c in _small_corpus() if c.convention == "megablox.gmm"]
    k = _kernel(_np_gmm_correct, "megablox.gmm", name="np-gmm", version="1")
    rc, text = regenerate(corpus, tmp_path, stream=io.StringIO())
    assert rc == 0
    rc, text = regenerate(corpus, tmp_path, kernel=k, stream=io.StringIO())
    assert rc in (0, 1)  # same bits as the reference, or a change that needs --update
    rc, text = regenerate(corpus, tmp_path, kernel=k, update=True, stream=io.StringIO())
    assert rc == 0, text
    goldens = GoldenStore(tmp_path).manifest()["cases"]["b-gmm-bf16"]
    assert {e["producer"]["name"] for e in goldens.values()} == {"reference", "np-gmm"}  # side by side
    (res,) = check_goldens(k, tmp_path)
    assert (res.status, res.criterion) == (Status.PASSED, "bit-for-bit")

    def one_ulp_off(*args, **kwargs):
        out = _np_gmm_correct(*args, **kwargs)
        out.view(np.uint16)[1, 2] += 1  # one bfloat16 ulp
        return out

    drifted = _kernel(one_ulp_off, "megablox.gmm", name="np-gmm", version="1")
    (res,) = check_goldens(drifted, tmp_path)
    assert res.status is Status.FAILED and res.criterion == "bit-for-bit"
    assert "not bit-for-bit equal to its own golden" in res.detail and "group 0 (rows [0, 2), size 2)" in res.detail
    newer = _kernel(one_ulp_off, "megablox.gmm", name="np-gmm", version="2")
    (res,) = check_goldens(newer, tmp_path)  # another version: judged within the bound
    assert res.criterion == "bound"


def test_a_kernel_outside_the_bound_is_not_stored(small):
    broken = _kernel(_np_ragged_dot_off_by_one, "ragged_dot", name="off_by_one")
    before = _snapshot(small)
    rc, text = regenerate(_small_corpus(), small, kernel=broken, update=True, stream=io.StringIO())
    assert rc == 1 and "a-rd: off_by_one: output outside the gmm_ref bound" in text
    assert "group 2 (rows [3, 7), size 4)" in text
    assert _snapshot(small) == before


# ----------------------------------------------------------------------- generator
def test_generator_is_splitmix64_and_pinned():
    assert int(generator.splitmix64(0, 1)[0]) == 0xE220A8397B1DCDAF  # SplitMix64's first output for seed 0
    assert array_sha256(generator.values(1, "lhs", (3, 5), "bfloat16")) == \
        "b8ecb72e2863367a3326ee979cf9780e184c9b995a5d2b8450fe38f99ba4fa6d"
    assert array_sha256(generator.values(7, "rhs", (4, 4), "int8", kind="int", int_range=100)) == \
        "63b0666d5c099d3f32d4c79533e0047f57768163bc6986dfd96e750bfd74f8f8"
    v = generator.values(0, "lhs", (4,), "float32")
    np.testing.assert_array_equal(v, np.array([0.41165492, 0.9014094, -0.43144464, -0.7695345], np.float32))
    # counter-based: element i does not depend on how many are drawn
    np.testing.assert_array_equal(generator.values(3, "x", (10,), "float16")[:4],
                                  generator.values(3, "x", (4,), "float16"))
    ints = generator.values(5, "x", (1000,), "float32", kind="int", int_range=3)
    assert set(np.unique(ints).tolist()) == {-3, -2, -1, 0, 1, 2, 3}


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
                                   np.float16, np.int32])
def test_narrow_dtypes_round_trip_through_npz(tmp_path, dtype):
    bits = np.arange(256, dtype=np.uint8).repeat(np.dtype(dtype).itemsize)
    out = bits.view(dtype).reshape(-1, 8) if np.dtype(dtype).itemsize <= 2 else \
        np.arange(-64, 64, dtype=dtype).reshape(-1, 8)
    mask = np.ones(out.shape, bool)
    path = tmp_path / "x.npz"
    path.write_bytes(GoldenStore.encode(out, mask))
    with np.load(path, allow_pickle=False) as z:  # plain NumPy reads every member
        assert z["out"].dtype.kind in ("ui" if "float8" in str(np.dtype(dtype)) or
                                       np.dtype(dtype) == ml_dtypes.bfloat16 else np.dtype(dtype).kind)
    entry = {"file": "x.npz", "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
             "output_sha256": array_sha256(out), "mask_sha256": array_sha256(mask),
             "spec": _small_corpus()[0].to_json()}
    g = GoldenStore(tmp_path).load("a-rd", entry)
    assert g.out.dtype == np.dtype(dtype)
    assert g.out.tobytes() == out.tobytes()


def test_npz_files_are_deterministic():
    out = np.arange(12, dtype=np.float32).reshape(3, 4)
    mask = out > 3
    assert GoldenStore.encode(out, mask) == GoldenStore.encode(out.copy(), mask.copy())


@needs_data
def test_python_m_golden_verify_runs_from_any_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "golden", "verify", "--cases", "rd-*"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "golden verify ok: 9 case(s)" in proc.stdout


@needs_data
def test_downstream_entry_point_takes_a_corpus_by_import_path(tmp_path):
    """``python -m golden --dir PATH --corpus pkg.mod:CASES``, as a downstream repo runs it."""
    proc = subprocess.run([sys.executable, "-m", "golden", "verify", "--dir", str(DATA),
                           "--corpus", "golden.cases:CASES", "--cases", "rd-*"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "golden verify ok: 9 case(s)" in proc.stdout


def test_a_missing_kernel_golden_names_the_command_that_makes_it(small, capsys):
    """--kernel-version without the kernel's own goldens fails, and the printed command makes them."""
    pytest.importorskip("jax")
    argv = ["check", "--dir", str(small), "--kernel", LOCAL_KERNEL, "--convention", "ragged_dot",
            "--kernel-version", "7.1"]
    assert golden_main(argv) == 1
    out = capsys.readouterr().err  # a failing run reports on stderr
    assert "(missing; to make them run: python -m golden regenerate" in out
    command = out.split("to make them run: ")[1].split(")\n")[0]
    assert golden_main(shlex.split(command)[3:]) == 0  # the command as printed, without "python -m golden"
    capsys.readouterr()
    assert golden_main(argv) == 0
    assert "(bit-for-bit)" in capsys.readouterr().out
