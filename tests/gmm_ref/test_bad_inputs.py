"""Every bad input is a named error: one table of them, each with its exception type and message.

The table covers the reference front-ends, ``Problem``, the strategies,
``check_kernel``, the main job's CLI, the golden CLI and the plugin's options.
A message must name the argument and say what was expected; a CLI usage error
exits 2 (pytest's: 4).
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis.errors import InvalidArgument

import gmm_ref
from gmm_ref import Numerics, Problem, RaggedDotDimensionNumbers, as_tiling, conventions
from property_tests import strategies as gst
from property_tests.checks.check import check_kernel

F = np.float32
L2, R3, GS = np.ones((6, 4), F), np.ones((2, 4, 3), F), np.array([2, 4])
DN = RaggedDotDimensionNumbers((([1], [1]), ([], [])), [0], [0])


def _rd(**kw):
    return gmm_ref.ragged_dot(kw.pop("lhs", L2), kw.pop("rhs", R3), kw.pop("group_sizes", GS), **kw)


def _p(family="ragged_m", lhs=L2, rhs=R3, gs=GS, **kw):
    return Problem(family, lhs, rhs, gs, **kw)


def _te(**kw):
    return gmm_ref.te_grouped_gemm(np.ones((6, 4), F), np.ones((4, 3), F), **kw)


def _user(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    return lhs


def _torch_user(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    return mat_a


FRONT_ENDS = [
    ("precision", lambda: _rd(precision="bogus"), ValueError, "precision: expected None, a jax.lax.Precision"),
    ("lhs ndim", lambda: _rd(lhs=np.ones((1, 6, 4), F)), ValueError, "lhs: expected 2 dims"),
    ("rhs groups", lambda: _rd(rhs=np.ones((3, 4, 3), F)), ValueError, "rhs: expected 2 groups on axis 0"),
    ("float sizes", lambda: _rd(group_sizes=np.array([2.0, 4.0])), TypeError, "group_sizes: expected an integer"),
    ("2-D sizes", lambda: _rd(group_sizes=np.array([[2, 4]])), ValueError, "group_sizes: expected a 1-D array"),
    ("lhs string", lambda: _rd(lhs="lhs"), TypeError, "lhs: expected an array"),
    ("out dtype", lambda: _rd(preferred_element_type="bogus"), TypeError, "preferred_element_type: expected one of"),
    ("with_reference", lambda: _rd(with_reference="yes"), TypeError, "with_reference: expected a bool"),
    ("dimension numbers", lambda: gmm_ref.ragged_dot_general(L2, R3, GS, "dn"), TypeError,
     "ragged_dot_dimension_numbers: expected a RaggedDotDimensionNumbers"),
    ("two ragged dims", lambda: gmm_ref.ragged_dot_general(L2, R3, GS, DN._replace(lhs_ragged_dimensions=[0, 1])),
     ValueError, "expected exactly one lhs ragged dimension"),
    ("general precision", lambda: gmm_ref.ragged_dot_general(L2, R3, GS, DN, precision=("high", "x")), ValueError,
     "precision: expected None"),
    ("gmm group_offset", lambda: gmm_ref.gmm(L2, R3, GS, group_offset=1.5), TypeError,
     "group_offset: expected an integer scalar"),
    ("gmm existing_out", lambda: gmm_ref.gmm(L2, R3, GS, existing_out=np.ones((5, 3), F)), ValueError,
     "existing_out: expected shape (6, 3)"),
    ("gmm lhs ndim", lambda: gmm_ref.gmm(np.ones(6, F), R3, GS), ValueError, "lhs: expected 2 dims"),
    ("tgmm groups", lambda: gmm_ref.tgmm(np.ones((3, 6), F), np.ones((6, 2), F), GS, num_actual_groups=3),
     ValueError, "num_actual_groups: expected an int in [0, G - group_offset = 2]"),
    ("tgmm bool groups", lambda: gmm_ref.tgmm(np.ones((3, 6), F), np.ones((6, 2), F), GS, num_actual_groups=True),
     ValueError, "num_actual_groups: expected an int"),
    ("torch bias", lambda: gmm_ref.grouped_mm(L2, R3, offs=np.array([2, 6]), bias=np.ones(3, F)), ValueError,
     "bias: torch._grouped_mm does not support bias"),
    ("torch offs order", lambda: gmm_ref.grouped_mm(L2, R3, offs=np.array([4, 2])), ValueError,
     "offs: expected non-decreasing cumulative group ends"),
    ("torch offs missing", lambda: gmm_ref.grouped_mm(L2, R3), ValueError, "offs: required"),
    ("torch offs batched", lambda: gmm_ref.grouped_mm(R3, R3.transpose(0, 2, 1), offs=np.array([1, 2])), ValueError,
     "offs: must be None"),
    ("torch ndim", lambda: gmm_ref.grouped_mm(np.ones((1, 1, 6, 4), F), R3, offs=np.array([2, 6])), ValueError,
     "mat_a: expected 2 or 3 dims"),
    ("te two axes", lambda: _te(lhs_first_dims=GS, lhs_last_dims=GS), ValueError,
     "lhs_first_dims/lhs_last_dims: an operand may be ragged on one axis only"),
    ("te no sizes", lambda: _te(), ValueError, "at least one must be given"),
    ("te contracting", lambda: _te(lhs_first_dims=GS, contracting_dims=(1, 0)), ValueError,
     "contracting_dims: expected ((l,), (r,))"),
    ("te sizes differ", lambda: _te(lhs_last_dims=GS, rhs_first_dims=np.array([1, 3])), ValueError,
     "every ragged axis must carry the same group sizes"),
    ("te combination", lambda: _te(lhs_first_dims=GS, rhs_first_dims=GS), ValueError,
     "unsupported combination"),
    ("reference of", lambda: gmm_ref.reference("problem"), TypeError, "problem: expected a gmm_ref.Problem"),
    ("arguments of", lambda: gmm_ref.arguments(_p()), ValueError, "convention: this problem names no convention"),
    ("check against", lambda: gmm_ref.check(L2, "problem"), TypeError, "problem_or_expected: expected a gmm_ref"),
    ("cotangent", lambda: gmm_ref.gradients(_p(), np.ones((6, 2), F)), ValueError, "cotangent: expected shape (6, 3)"),
    ("gradients of", lambda: gmm_ref.gradients("p", L2), TypeError, "problem: expected a gmm_ref.Problem"),
    ("bound numerics", lambda: gmm_ref.reference(_p()).bound("fp32"), TypeError, "numerics: expected gmm_ref.Numerics"),
    ("accumulator", lambda: Numerics(accumulate="bogus"), TypeError, "accumulate: expected one of"),
    ("flush", lambda: Numerics(flush_subnormals="yes"), TypeError, "flush_subnormals: expected a bool"),
    ("tiling text", lambda: as_tiling("1,2"), ValueError, "tiling: expected three positive ints"),
    ("convention name", lambda: conventions.get("cublas"), ValueError, "convention: expected one of"),
]

PROBLEMS = [
    ("family", lambda: _p(family="ragged_x"), ValueError, "family: expected one of"),
    ("tail", lambda: _p(tail="maybe"), ValueError, "tail: expected one of ('zero', 'undefined')"),
    ("empty", lambda: _p(empty="gone"), ValueError, "empty: expected one of"),
    ("existing policy", lambda: _p(existing_policy="add"), ValueError, "existing_policy: expected one of"),
    ("lhs list", lambda: _p(lhs=[[1.0]]), TypeError, "lhs: expected a numpy.ndarray, got list"),
    ("lhs complex", lambda: _p(lhs=L2.astype(np.complex64)), TypeError, "lhs: unsupported dtype complex64"),
    ("mixed kinds", lambda: _p(lhs=L2.astype(np.int8)), TypeError, "lhs/rhs: integer and floating inputs"),
    ("transposed flag", lambda: _p(lhs_transposed="yes"), TypeError, "lhs_transposed: expected a bool"),
    ("batch ndim", lambda: _p(batch_ndim=-1), ValueError, "batch_ndim: expected >= 0"),
    ("out dtype name", lambda: _p(out_dtype="float128x"), TypeError, "out_dtype: expected one of"),
    ("out dtype kind", lambda: _p(out_dtype=np.int32), TypeError, "out_dtype: int32 does not fit inputs"),
    ("lhs dims", lambda: _p(lhs=np.ones((1, 6, 4), F)), ValueError, "lhs: expected 2 dims for family 'ragged_m'"),
    ("contracting", lambda: _p(lhs=np.ones((6, 5), F)), ValueError, "contracting extents differ"),
    ("packed", lambda: _p(packed=True), ValueError, "packed: True, but no operand"),
    ("sizes missing", lambda: _p(gs=None), ValueError, "group_sizes: required for family 'ragged_m'"),
    ("negative size", lambda: _p(gs=np.array([-1, 4])), ValueError, "group_sizes: must be non-negative"),
    ("sum past extent", lambda: _p(gs=np.array([4, 4])), ValueError, "group_sizes: sum 8 exceeds the ragged extent 6"),
    ("size past extent", lambda: _p(gs=np.array([7, 0])), ValueError, "group_sizes: size 7 exceeds"),
    ("group_offset", lambda: _p(group_offset=3), ValueError, "group_offset: expected 0 <= group_offset <= G=2"),
    ("local groups", lambda: _p(num_local_groups=3), ValueError, "num_local_groups: expected 0 <= num_local_groups"),
    ("local rhs", lambda: _p(group_offset=1), ValueError, "rhs: expected 1 local groups on axis 0"),
    ("existing dtype", lambda: _p(existing_out=np.ones((6, 3), np.float64)), ValueError,
     "existing_out: expected shape"),
    ("existing list", lambda: _p(existing_out=[[0.0]]), TypeError, "existing_out: expected a numpy.ndarray"),
    ("tiling bool", lambda: _p(tiling=(True, 8, 8)), ValueError, "tiling: expected three positive ints"),
    # a problem's convention is checked where it is looked up (the registry): its arguments, its kernel
    ("convention", lambda: gmm_ref.arguments(_p(convention="bogus")), ValueError, "convention: expected one of"),
    ("convention type", lambda: _p(convention=123), TypeError, "convention: expected a convention name"),
    ("batch sizes", lambda: _p("batch", R3, R3.transpose(0, 2, 1), GS), ValueError,
     "group_sizes: the batch family takes none"),
    ("batch groups", lambda: _p("batch", R3, np.ones((3, 3, 4), F), None), ValueError,
     "rhs: expected 2 groups on axis 0"),
    ("offset type", lambda: _p(group_offset=0.5), TypeError, "group_offset: expected an integer"),
]

STRATEGIES = [
    ("vary_out_dtype", lambda: gst.problems(vary_out_dtype="x"),
     "vary_out_dtype='x', but it must be None, True or False"),
    ("all_empty", lambda: gst.problems(all_empty=1), "all_empty=1, but it must be True or False"),
    ("allow_tail", lambda: gst.problems(allow_tail="no"), "allow_tail='no', but it must be None, True or False"),
    ("max_groups", lambda: gst.problems(max_groups=10**6), "max_groups=1000000, but it must be at most 4096"),
    ("max_extent", lambda: gst.problems(max_extent=2**40), "max_extent=1099511627776, but it must be at most"),
    ("convention", lambda: gst.problems(convention="bogus"), "convention='bogus', but it must be None or one of"),
    ("families", lambda: gst.problems(convention="ragged_dot", families="ragged_n"), "families='ragged_n'"),
    ("dtypes", lambda: gst.problems(dtypes=["complex64"]), "dtypes=['complex64'], but 'complex64' is not a dtype"),
    ("values", lambda: gst.problems(values="fuzzy"), "values='fuzzy', but each must be one of"),
    ("tiling", lambda: gst.problems(tiling=(0, 8, 8)), "tiling=(0, 8, 8), but it must be three positive ints"),
    ("sharding", lambda: gst.problems(sharding="yes"), "sharding='yes', but it must be None, True or False"),
    ("existing_out", lambda: gst.problems(existing_out="yes"),
     "existing_out='yes', but it must be None, True or False"),
    ("max_buckets", lambda: gst.problems(max_buckets=0), "max_buckets=0, but it must be at least 1"),
    ("shapes", lambda: gst.problems(shapes=[(1, 2)]), "shapes=[(1, 2)], but it must be a non-empty sequence"),
    ("group extent", lambda: gst.group_sizes(extent=2**40), "extent=1099511627776, but it must be at most 2147483647"),
    ("group tail", lambda: gst.group_sizes(allow_tail="no"), "allow_tail='no', but it must be True or False"),
    ("group count", lambda: gst.group_sizes(num_groups=-1), "num_groups=-1, but it must be at least 0"),
    ("group tile", lambda: gst.group_sizes(tile=0), "tile=0, but it must be at least 1"),
    ("extent multiple", lambda: gst.extents(multiple_of=0), "multiple_of=0, but it must be at least 1"),
    ("extent range", lambda: gst.extents(min_value=5, max_value=3), "min_value=5 is greater than max_value=3"),
    ("shard groups", lambda: gst.shardings(num_groups=0), "num_groups=0, but it must be at least 1"),
    ("tile range", lambda: gst.tilings(min_tile=0), "min_tile=0, but it must be at least 1"),
    ("routed top_k", lambda: gst.routings(top_k=9, num_experts=8),
     "top_k=9, but with distinct_experts=True a token lists top_k different experts, more than the 8"),
    ("routed dtypes", lambda: gst.routings(dtypes=["int8"]), "dtypes=['int8'], but (int8, int8) is not a float"),
    ("routed expert_parallel", lambda: gst.routings(expert_parallel="yes"),
     "expert_parallel='yes', but it must be None, True or False"),
    ("routed tokens", lambda: gst.routings(num_tokens=[-1]), "num_tokens=-1, but it must be at least 0"),
    ("topk_ids top_k", lambda: gst.topk_ids(top_k=5, num_experts=3), "top_k=5, but with distinct_experts=True"),
    ("backward values", lambda: gst.routed_backwards(gst.routings(), values="odd"),
     "values='odd', but it must be one of ('exact', 'normal', 'wide', 'poisoned')"),
    ("backward routings", lambda: gst.routed_backwards([]),
     "routings=[], but it must be a strategy of gmm_ref.Routing"),
    ("backward existing", lambda: gst.routed_backwards(gst.routings(), existing="yes"),
     "existing='yes', but it must be True or False"),
    ("topk_weights dtype", lambda: gst.topk_weights(num_tokens=2, top_k=1, dtype="int8"),
     "dtype='int8', but each must be one of ['float32', 'float16', 'bfloat16']"),
]

CHECK_KERNEL = [
    ("zero tiling", dict(tiling=(0, 0, 0)), ValueError, "tiling: expected three positive ints"),
    ("two tiles", dict(tiling=(8, 8)), ValueError, "tiling: expected three positive ints"),
    ("modes string", dict(modes="exact"), TypeError, "modes: expected an iterable of mode names"),
    ("unknown mode", dict(modes=["bogus"]), ValueError, "modes: unknown mode 'bogus'"),
    ("no mode", dict(modes=[]), ValueError, "modes: expected at least one of"),
    ("max_examples", dict(max_examples=0), ValueError, "max_examples: expected a positive int or None"),
    ("profile", dict(profile="bogus"), ValueError, "profile: expected one of"),
    ("seed", dict(seed="x"), TypeError, "seed: expected an int or None"),
    ("numerics", dict(numerics="fp32"), TypeError, "numerics: expected a gmm_ref.Numerics"),
    ("convention", dict(convention="bogus"), ValueError, "convention: expected one of"),
    ("no convention", dict(convention=None), ValueError, "convention: required with kernel"),
    ("example_db type", dict(example_db=3), TypeError, "example_db: expected a directory, redis://HOST:PORT or 'off'"),
    ("example_db empty", dict(example_db=" "), ValueError, "example_db: expected a directory, redis://HOST:PORT"),
]


@pytest.mark.parametrize(("make", "exc", "text"), [c[1:] for c in FRONT_ENDS + PROBLEMS],
                         ids=[c[0] for c in FRONT_ENDS + PROBLEMS])
def test_reference_and_problem_refuse_with_a_named_error(make, exc, text):
    with pytest.raises(exc, match=re.escape(text)):
        make()


@pytest.mark.parametrize(("make", "text"), [c[1:] for c in STRATEGIES], ids=[c[0] for c in STRATEGIES])
def test_strategies_refuse_when_built(make, text):
    with pytest.raises(InvalidArgument, match=re.escape(text)):
        make()


@pytest.mark.parametrize(("options", "exc", "text"), [c[1:] for c in CHECK_KERNEL], ids=[c[0] for c in CHECK_KERNEL])
def test_check_kernel_refuses_with_a_named_error(options, exc, text):
    with pytest.raises(exc, match=re.escape(text)):
        check_kernel(_user, **{"convention": "ragged_dot", **options})


@pytest.mark.parametrize(("kernel", "options", "exc", "text"), [
    ("no_such_kernel", {}, ValueError, "kernel: 'no_such_kernel' is neither a built-in adapter"),
    ("no.such.module:fn", {}, ImportError, "kernel 'no.such.module:fn': cannot import 'no.such.module'"),
    ("te.grouped_gemm", {}, ValueError, "kernel: te.grouped_gemm cannot run here, so nothing would be checked"),
    (_torch_user, {"convention": "torch.grouped_mm", "modes": ["sharded"]}, ValueError,
     "every mode of tests.gmm_ref.test_bad_inputs:_torch_user is unsupported"),
], ids=["unknown", "unimportable", "unavailable", "nothing checked"])
def test_check_kernel_refuses_kernels_it_cannot_check(kernel, options, exc, text):
    with pytest.raises(exc, match=re.escape(text)):
        check_kernel(kernel, **options)


MAIN = [
    (["--kernel", "jax.ragged_dot", "--tiling", "16,16"], "--tiling: expected three positive ints"),
    (["--kernel", "jax.ragged_dot", "--tiling", "16,x,16"], "--tiling: expected three positive ints"),
    (["--kernel", "jax.ragged_dot", "--tiling", "0,16,16"], "--tiling: expected three positive ints"),
    (["--kernel", "numpy:matmul", "--convention", "ragged_dot", "--convention", "megablox.gmm"],
     "--convention: given twice"),
    (["--kernel", "no_such_kernel"], "--kernel: 'no_such_kernel' is neither a built-in adapter"),
    (["--kernel", "numpy:matmul"], "--convention: required with --kernel 'numpy:matmul'"),
    (["--convention", "ragged_dot"], "--convention: given without --kernel"),
    (["--max-examples", "0"], "argument --max-examples: expected a positive number"),
    (["--timeout", "-1"], "argument --timeout: expected a positive number"),
    (["--kernel", "te.grouped_gemm", "--in-process", "--no-goldens"],
     "--kernel: nothing was checked for te.grouped_gemm"),
    (["--jobs", "0"], "argument --jobs/-j: expected a positive number"),
    (["--jobs", "2", "--in-process"], "--jobs: given with --in-process"),
    (["--compile-cache", "a", "--compile-cache", "b"], "--compile-cache: given twice"),
    (["--budget", "0"], "argument --budget: expected a positive number"),
    (["--budget", "5", "--budget", "9"], "--budget: given twice"),
    (["--shard", "0/2", "--json", "x.json"], "--shard: expected 1 <= I <= N in I/N, got '0/2'"),
    (["--shard", "3/2", "--json", "x.json"], "--shard: expected 1 <= I <= N in I/N, got '3/2'"),
    (["--shard", "half", "--json", "x.json"], "--shard: expected I/N"),
    (["--shard", "1/2"], "--shard: given without --json"),
    (["--durations", "/no/such.json"], "--durations: no such file '/no/such.json'"),
    (["--durations", __file__, "--shard", "1/2", "--json", "x.json"],
     "--durations: expected the --json file of an earlier gmm-harness check"),
    (["--example-db", ""], "--example-db: expected a directory, redis://HOST:PORT or 'off'"),
    (["--example-db", "http://example.com/db"], "--example-db: expected a directory or redis://HOST:PORT, got the URL"),
    (["--example-db", __file__], "--example-db: expected a directory, got the file"),
    (["--example-db", "off,/tmp/x"], "--example-db: 'off' cannot be joined with other databases"),
    (["--example-db", "redis://127.0.0.1:1/0"], "--example-db: cannot reach the Redis server 'redis://127.0.0.1:1/0'"),
    (["--bogus-option"], "unrecognized arguments: --bogus-option"),
    (["--modes", "exact,nope"], "--modes: expected some of exact, normal"),
    (["--modes", ","], "--modes: expected a comma-separated list"),
    (["--modes", "exact", "--modes", "normal"], "--modes: given twice"),
    (["--dtypes", "bfloat16"], "--dtypes: given without --kernel"),
    (["--no-tail"], "--no-tail: given without --kernel"),
    (["--kernel-version", "1.0"], "--kernel-version: given without --kernel"),
    (["--kernel", "jax.ragged_dot", "--kernel", "megablox.gmm", "--kernel-version", "1"],
     "--kernel-version: applies to one --kernel, got 2"),
    (["--kernel", "jax.ragged_dot", "--families", "ragged_k"],
     "--families: ('ragged_k',) leaves none of ragged_dot's ('ragged_m',) (kernel jax.ragged_dot)"),
    (["--kernel", "jax.ragged_dot", "--families", "ragged_x"], "--families: families: expected some of"),
    (["--kernel", "jax.ragged_dot", "--dtypes", "float33"], "--dtypes: dtypes: expected one of"),
    (["--kernel", "jax.ragged_dot", "--dtypes", "int8", "--out-dtypes", "float32"],
     "leave none of ragged_dot's input/output dtypes"),
    (["--kernel", "jax.ragged_dot", "--multiple", "k=x"], "--multiple: expected AXIS=N"),
    (["--kernel", "jax.ragged_dot", "--numerics", "accumulate=float99"], "--numerics: accumulate"),
    (["--kernel", "jax.ragged_dot", "--numerics", "fast"], "--numerics: expected accumulate=DTYPE"),
    (["--kernel", "jax.ragged_dot", "--layouts", "plane"],
     "--layouts: expected one or more of the layouts ('plain', 'rhsT', 'lhsT'"),
    (["--kernel", "jax.ragged_dot", "--layouts", "rhsT"],
     "--layouts: ('rhsT',) leaves none of ragged_dot's layouts ('plain',) (kernel jax.ragged_dot)"),
    (["--kernel", "jax.ragged_dot", "--alignment", "lhs=12"], "--alignment: expected a power of two of bytes"),
    (["--golden-dir", "/no/such/dir"], "--golden-dir: expected a golden directory with a manifest.json"),
    (["--no-goldens", "--golden-dir", "."], "--no-goldens: given with --golden-dir"),
]


@pytest.mark.parametrize(("argv", "text"), MAIN, ids=[" ".join(a) for a, _ in MAIN])
def test_main_job_usage_errors_exit_2(argv, text):
    from property_tests.cli.main import main

    err = io.StringIO()
    with pytest.raises(SystemExit) as info, contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        main(["check", *argv])
    assert info.value.code == 2 and text in err.getvalue(), err.getvalue()


GOLDEN = [
    (["check", "--kernel", "no_such_kernel"], "'no_such_kernel' is neither a built-in adapter"),
    (["check", "--kernel", "numpy:matmul"], "--convention: required with --kernel 'numpy:matmul'"),
    (["verify", "--corpus", "no.such.module:CASES"], "--corpus 'no.such.module:CASES': cannot import"),
    (["list", "--corpus", "gmm_ref:FAMILIES"], "case spec"),
    (["regenerate", "--wait", "x"], "argument --wait: invalid float value"),
]


@pytest.mark.parametrize(("argv", "text"), GOLDEN, ids=[" ".join(a) for a, _ in GOLDEN])
def test_golden_cli_usage_errors_exit_2(argv, text, tmp_path):
    from golden.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main([*argv, "--dir", str(tmp_path)] if argv[0] != "regenerate" else argv)
        except SystemExit as exc:
            rc = exc.code
    assert rc == 2 and text in err.getvalue(), err.getvalue()


PLUGIN = [
    (["--gmm-convention=bogus"], "--gmm-convention: given without --gmm-kernel"),
    (["--gmm-tiling=1,2"], "--gmm-tiling: given without --gmm-kernel"),
    (["--gmm-kernel=jax.ragged_dot", "--gmm-tiling=1,2"], "--gmm-tiling: expected three positive ints TM,TK,TN"),
    (["--gmm-kernel=jax.ragged_dot", "--gmm-convention=bogus"], "--gmm-convention: expected one of"),
    (["--gmm-kernel=no_such_kernel"], "--gmm-kernel: 'no_such_kernel' is neither a built-in adapter"),
    (["--gmm-dtypes=bfloat16"], "--gmm-dtypes: given without --gmm-kernel"),
    (["--gmm-kernel=jax.ragged_dot", "--gmm-families=ragged_k"],
     "--gmm-families: ('ragged_k',) leaves none of ragged_dot's"),
    (["--gmm-kernel=jax.ragged_dot", "--gmm-multiple=q=2"], "--gmm-multiple: expected AXIS=N"),
    (["--gmm-kernel=jax.ragged_dot", "--gmm-numerics=fast"], "--gmm-numerics: expected accumulate=DTYPE"),
    (["--gmm-kernel=jax.ragged_dot", "--gmm-layouts=lhsT"], "--gmm-layouts: ('lhsT',) leaves none of ragged_dot's"),
    (["--gmm-kernel=jax.ragged_dot", "--gmm-alignment=out=16"], "--gmm-alignment: expected a power of two"),
    (["--gmm-example-db="], "--gmm-example-db: expected a directory, redis://HOST:PORT or 'off'"),
    (["--gmm-example-db=ftp://host/x"], "--gmm-example-db: expected a directory or redis://HOST:PORT, got the URL"),
]


@pytest.mark.parametrize(("argv", "text"), PLUGIN, ids=[" ".join(a) for a, _ in PLUGIN])
def test_plugin_options_are_checked_whenever_given(argv, text, tmp_path):
    (tmp_path / "test_probe.py").write_text("def test_nothing():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           *argv, str(tmp_path / "test_probe.py")], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 4 and text in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_the_table_is_large_enough():
    total = len(FRONT_ENDS) + len(PROBLEMS) + len(STRATEGIES) + len(CHECK_KERNEL) + 4 + len(MAIN) + len(GOLDEN) \
        + len(PLUGIN)
    assert total >= 80, total


def test_nothing_of_a_bfloat16_problem_is_refused():
    """The good twin: valid input of every kind goes through."""
    p = _p(lhs=L2.astype(ml_dtypes.bfloat16), rhs=R3.astype(ml_dtypes.bfloat16), convention="megablox.gmm",
           tail="undefined", tiling=(2, 2, 2))
    assert gmm_ref.arguments(p)[1]["tiling"] == (2, 2, 2)
