"""Fast unit tests of the kernel adapters (gmm_kernels): availability and support reasons,
exact bfloat16 conversions, wrapping user functions, and the declarations the suite reads
(known_issues, max_examples, limits) and the strategy options they give (property_tests.checks.declared).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import gmm_kernels
import gmm_ref
from gmm_kernels.base import KernelAdapter, missing_module
from gmm_kernels.sandbox.convert import to_jax, to_torch, torch_dtype, uses_64bit
from gmm_kernels.scope import FEATURES, Limits
from gmm_ref import as_numpy as to_numpy
from property_tests.checks.declared import limits_options, problem_options
from property_tests.checks.modes import ALL_MODES, MODES

BF16 = np.dtype(ml_dtypes.bfloat16)
ADAPTERS = gmm_kernels.registry()
IDS = [a.name for a in ADAPTERS]


def _problem(family="ragged_m", sizes=(3, 0, 5), m=8, k=4, n=4, dtype=np.float32, convention=None, **kw):
    rng = np.random.default_rng(0)
    g = len(sizes)
    shapes = {"ragged_m": ((m, k), (g, k, n)), "ragged_k": ((m, k), (k, n)), "ragged_n": ((g, m, k), (k, n))}
    ls, rs = shapes[family]
    return gmm_ref.Problem(family, rng.integers(-2, 3, ls).astype(dtype), rng.integers(-2, 3, rs).astype(dtype),
                           np.array(sizes), convention=convention, **kw)


# ------------------------------------------------------------------ availability
@pytest.mark.parametrize("adapter", ADAPTERS, ids=IDS)
def test_available_is_none_or_a_reason(adapter):
    why = adapter.available()
    assert why is None or (isinstance(why, str) and why.strip()), repr(why)


def test_missing_kernels_say_why():
    reasons = {a.name: a.available() for a in ADAPTERS}
    assert reasons["te.grouped_gemm"] == "transformer_engine is not installed"
    # each GPU/TPU-only implementation names why, whether its package is missing or the device is
    installed = {"tokamax": "tokamax is not installed", "ejkernel": "ejkernel is not installed"}
    for name in ("tokamax.ragged_dot[mosaic]", "tokamax.ragged_dot[triton]"):
        assert "NotImplementedError('Not supported on cpu')" in reasons[name] or reasons[name] == installed["tokamax"]
    for name in ("ejkernel.grouped_matmul[pallas_v2]", "ejkernel.grouped_matmul[pallas_v3]"):
        assert "Unsupported TPU device kind: cpu" in reasons[name] or reasons[name] == installed["ejkernel"]
    assert missing_module("jax", "surely_not_a_module_xyz") == "surely_not_a_module_xyz is not installed"
    assert missing_module("numpy") is None


def test_names_are_unique_and_get_finds_them():
    assert len(set(IDS)) == len(IDS)
    assert gmm_kernels.get("megablox.gmm").name == "megablox.gmm"
    with pytest.raises(KeyError, match="no kernel adapter 'nope'"):
        gmm_kernels.get("nope")


# ---------------------------------------------------------------------- supports
SUPPORT_CASES = [
    ("jax.ragged_dot", dict(), None),
    ("jax.ragged_dot", dict(family="ragged_k", sizes=(1, 3)), "expresses the families ('ragged_m',), not 'ragged_k'"),
    ("jax.ragged_dot", dict(convention="megablox.gmm", tail="undefined"), "takes the 'ragged_dot' convention"),
    ("jax.ragged_dot_general", dict(family="ragged_n", n=8), "not 'ragged_n'"),
    ("megablox.gmm", dict(sizes=(3, 0, 5), tiling=(8, 8, 8)), None),
    ("megablox.gmm", dict(sizes=(3, 0, 5)), "needs M=8 to be a multiple of 128 (the tile tm)"),
    ("megablox.gmm", dict(dtype=np.float16, tiling=(8, 8, 8)), "takes inputs of float32 / bfloat16, not lhs float16"),
    ("megablox.gmm", dict(m=12, sizes=(3, 0, 5), tiling=(8, 8, 8)), "needs M=12 to be a multiple of 8"),
    ("megablox.tgmm", dict(family="ragged_m"), "expresses the families ('ragged_k',), not 'ragged_m'"),
    ("torch.grouped_mm", dict(out_dtype=np.float64), "takes the (input, output) dtypes"),
    ("torch.grouped_mm", dict(k=6), "needs K=6 to be a multiple of 4 (16 bytes of the input dtype)"),
    ("jax.ragged_dot_mgpu", dict(sizes=(8,), m=8, k=8, n=8), "G=1 kills the process"),
    ("ejkernel.grouped_matmul[xla]", dict(existing_out=np.zeros((8, 4), np.float32), tiling=(8, 8, 8)),
     "adds existing_out"),
]


@pytest.mark.parametrize(("name", "kw", "expected"), SUPPORT_CASES)
def test_supports_reasons(name, kw, expected):
    adapter = gmm_kernels.get(name)
    if name == "ejkernel.grouped_matmul[xla]" and adapter.available():
        pytest.skip(adapter.available())
    why = adapter.supports(_problem(**kw))
    if expected is None:
        assert why is None
    else:
        assert isinstance(why, str) and expected in why, why


@pytest.mark.parametrize("adapter", ADAPTERS, ids=IDS)
def test_supports_gives_a_reason_for_a_foreign_family(adapter):
    p = _problem(family="ragged_n", n=8)
    if adapter.convention in ("torch.grouped_mm", "te.grouped_gemm"):
        p = _problem(family="ragged_n", n=8, dtype=np.float64)  # ragged N is theirs; float64 is not
    why = adapter.supports(p)
    assert isinstance(why, str) and why.strip()


# --------------------------------------------------------------- bf16 conversions
ALL_BF16 = np.arange(1 << 16, dtype=np.uint16).view(BF16)  # every bit pattern, NaN payloads included


def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint16), b.view(np.uint16))


def test_bf16_torch_round_trip_is_bit_exact():
    torch = pytest.importorskip("torch")
    t = to_torch(ALL_BF16)
    assert t.dtype == torch.bfloat16
    assert _same_bits(to_numpy(t), ALL_BF16)
    # strided views keep their strides and values
    m = ALL_BF16[:4096].reshape(64, 64)[:, ::2]
    assert _same_bits(to_numpy(to_torch(m)), m)
    assert torch_dtype(BF16) is torch.bfloat16 and torch_dtype(np.float16) is torch.float16
    assert torch_dtype(None) is None


def test_bf16_jax_round_trip_is_bit_exact():
    jnp = pytest.importorskip("jax.numpy")
    x = to_jax(ALL_BF16)
    assert x.dtype == jnp.bfloat16
    assert _same_bits(to_numpy(x), ALL_BF16)


def test_bit_comparison_catches_a_lossy_conversion():
    lossy = ALL_BF16.astype(np.float16).astype(BF16)  # what a float16 detour does
    assert not _same_bits(lossy, ALL_BF16)
    assert not _same_bits(ALL_BF16.astype(np.float32), ALL_BF16)  # dtype changed


def test_uses_64bit():
    assert uses_64bit(np.zeros(2, np.float64)) and uses_64bit(None, np.int64) and uses_64bit("float64")
    assert not uses_64bit(np.zeros(2, np.float32), BF16, None, "not a dtype")


# -------------------------------------------------------------------------- wrap
def _numpy_ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    lhs, rhs, gs = np.asarray(lhs), np.asarray(rhs), np.asarray(group_sizes)
    out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float32)
    ends = np.cumsum(gs)
    for g, (s, e) in enumerate(zip(ends - gs, ends, strict=True)):
        out[s:e] = lhs[s:e].astype(np.float32) @ rhs[g].astype(np.float32)
    return out.astype(preferred_element_type or lhs.dtype)


def test_wrap_user_function_returning_numpy():
    seen = {}

    def fn(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        seen["type"] = type(lhs).__module__
        return _numpy_ragged_dot(lhs, rhs, group_sizes, precision, preferred_element_type)

    adapter = gmm_kernels.wrap(fn, "ragged_dot", name="user-numpy")
    p = _problem(convention="ragged_dot")
    gmm_ref.assert_matches_reference(adapter.run(p), p)
    assert seen["type"].startswith("jax")  # jax conventions receive jax arrays
    assert adapter.name == "user-numpy" and isinstance(adapter, KernelAdapter)


def test_wrap_user_function_returning_jax():
    jax = pytest.importorskip("jax")

    def fn(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, precision=None, preferred_element_type=None):
        assert isinstance(ragged_dot_dimension_numbers, jax.lax.RaggedDotDimensionNumbers)
        return jax.lax.ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers,
                                          preferred_element_type=preferred_element_type)

    adapter = gmm_kernels.wrap(fn, "ragged_dot_general")
    for p in (_problem(convention="ragged_dot_general", dtype=BF16),
              _problem(family="ragged_k", sizes=(1, 0, 3), convention="ragged_dot_general")):
        out = adapter.run(p)
        assert isinstance(out, np.ndarray)
        gmm_ref.assert_matches_reference(out, p)


def test_wrap_user_function_returning_torch():
    torch = pytest.importorskip("torch")
    seen = {}

    def fn(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
        seen.update(a=type(mat_a), offs=offs.dtype, out_dtype=out_dtype)
        return torch._grouped_mm(mat_a, mat_b, offs=offs, out_dtype=out_dtype)

    adapter = gmm_kernels.wrap(fn, "torch.grouped_mm")
    p = _problem(sizes=(3, 0, 5), k=8, n=8, dtype=BF16, convention="torch.grouped_mm", tail="undefined")
    out = adapter.run(p)
    assert out.dtype == BF16
    gmm_ref.assert_matches_reference(out, p)
    assert seen == {"a": torch.Tensor, "offs": torch.int32, "out_dtype": torch.bfloat16}


def test_wrapped_wrong_function_is_rejected():
    def fn(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
        out = _numpy_ragged_dot(lhs, rhs, group_sizes, precision, preferred_element_type)
        return out[::-1].copy()  # rows reversed

    p = _problem(convention="ragged_dot")
    with pytest.raises(gmm_ref.Mismatch):
        gmm_ref.assert_matches_reference(gmm_kernels.wrap(fn, "ragged_dot").run(p), p)
    with pytest.raises(ValueError, match="convention: expected one of"):
        gmm_kernels.wrap(fn, "not-a-convention")


# ------------------------------------------------------------------ declarations
@pytest.mark.parametrize("adapter", ADAPTERS, ids=IDS)
def test_declarations_are_well_formed(adapter):
    issues = adapter.known_issues
    assert isinstance(issues, tuple) and all(isinstance(k, gmm_kernels.KnownIssue) for k in issues)
    for issue in (*issues, *adapter.known_gradient_issues.values()):
        assert set(issue.modes) <= set(ALL_MODES), f"{adapter.name}: known issue modes {issue.modes}"
        assert len(issue.text) > 40 and issue.versions, issue
    assert set(adapter.known_gradient_issues) <= {"lhs", "rhs", "existing_out"}
    me = adapter.max_examples
    assert me is None or (isinstance(me, int) and me > 0)
    assert isinstance(adapter.limits(), Limits)
    assert isinstance(problem_options(adapter), dict)


def test_limits_become_strategy_keywords():
    """The facts an adapter states, in the strategies' words (only those that narrow)."""
    pair = (np.dtype(np.float32), np.dtype(np.float32))
    assert limits_options(Limits()) == {}
    assert limits_options(Limits(dtypes=(pair,), families=("ragged_m",), multiples={"k": 8}, max_extent=64,
                                 min_groups=2, max_groups=4, tail=False, zero_extents=(),
                                 quantizations=((None, None),), refuses=("existing_out", "sharding"))) == {
        "dtypes": (pair,), "families": ("ragged_m",), "multiple_of": {"k": 8}, "max_extent": 64, "min_groups": 2,
        "max_groups": 4, "allow_tail": False, "zero_extents": (), "quantizations": ((None, None),),
        "existing_out": False, "sharding": False}
    import inspect

    from property_tests.strategies import problems

    keywords = inspect.signature(problems).parameters
    assert set(FEATURES) <= set(keywords), "every feature a kernel may refuse is the strategy keyword that draws it"


def test_a_scope_narrows_an_adapters_own_limits():
    """The scope narrows the kernel's own limits: multiples combine (lcm), zero extents intersect, no tail wins."""
    own = Limits(multiples={"m": 8, "k": 8}, zero_extents=("m", "k"), tail=True)
    got = own.narrowed(gmm_kernels.Scope(multiples={"k": 12, "n": 4}, zero_extents=("k", "n"), tail=False))
    assert (dict(got.multiples), got.zero_extents, got.tail) == ({"m": 8, "k": 24, "n": 4}, ("k",), False)
    assert own.narrowed(None) is own
    assert Limits(zero_extents=None).narrowed(gmm_kernels.Scope(zero_extents=("n",))).zero_extents == ("n",)
    for bad in (dict(refuses=("tiling",)), dict(min_groups=0), dict(min_groups=3, max_groups=2),
                dict(multiples={"q": 2}), dict(zero_extents=("x",)), dict(families=("ragged_q",))):
        with pytest.raises(ValueError, match=f"^{list(bad)[-1]}: expected"):
            Limits(**bad)


def test_limits_carry_the_adapters_dtype_declarations_and_scope():
    class F32Only(KernelAdapter):
        name, convention, input_dtypes = "f32only", "ragged_dot_general", ("float32",)

    adapter = F32Only()
    assert adapter.limits().dtypes and all(str(i) == "float32" for i, _ in adapter.limits().dtypes)
    assert adapter.limits().families is None
    adapter = gmm_kernels.configure(adapter, scope=gmm_kernels.Scope(families=("ragged_k",), tail=False))
    assert (adapter.limits().families, adapter.limits().tail) == (("ragged_k",), False)


@pytest.mark.parametrize("adapter", ADAPTERS, ids=IDS)
def test_strategy_options_draw_problems_the_adapter_takes(adapter):
    """Every cell of every mode's covering design draws problems the kernel takes: a declined draw
    is time spent checking nothing (before its strategy options said so, half of torch.grouped_mm's
    draws had K = 0 or N = 0, and no cell of the Mosaic GPU kernel drew a shape it takes)."""
    from hypothesis.errors import InvalidArgument

    from property_tests.checks.modes import Unsupported, mode_covering

    if adapter.available():
        pytest.skip(adapter.available())
    if adapter.routed:  # one cell of routings per mode (property_tests.checks.routed_run.run_routed)
        _routings_are_taken(adapter)
        return
    declined, drawn = [], []
    # the modes whose options differ (normal, wide, poisoned and all_empty draw exact's signatures)
    for mode in ("exact", "many_groups", "sharded", "sharded_existing", "grad", "out_dtype"):
        try:
            cells = mode_covering(adapter, mode).cells
        except (Unsupported, InvalidArgument):
            continue
        for cc in cells:
            where = f"{mode} {cc.family} {cc.cell.describe()}"

            @settings(max_examples=1, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(p=cc.strategy)
            def prop(p):
                drawn.append(where)  # noqa: B023 - prop runs within this iteration
                why = adapter.supports(p)
                if why:
                    declined.append(f"{where}: {why}")  # noqa: B023 - prop runs within this iteration

            prop()
    assert drawn
    assert not declined, f"{len(declined)} of {len(drawn)} cells: {declined[:3]}"


def _nan_leak_problem(convention: str) -> gmm_ref.Problem:
    """Group 1 is empty and its rhs is NaN: no output element reads it."""
    rhs = np.stack([np.ones((2, 2), np.float32), np.full((2, 2), np.nan, np.float32)])
    kw = dict(tail="undefined", tiling=(8, 8, 8)) if convention == "megablox.gmm" else {}
    if convention == "qwix.ragged_dot":  # QArrays: float8 codes (NaN in the empty group's), K a multiple of 16
        e4m3 = ml_dtypes.float8_e4m3fn
        q = gmm_ref.conventions.qwix.QARRAY_QUANTIZATIONS[0]
        rhs = np.stack([np.ones((16, 2)), np.full((16, 2), np.nan)]).astype(e4m3)
        return gmm_ref.Problem("ragged_m", np.ones((8, 16), e4m3), rhs, np.array([8, 0]), convention=convention,
                               out_dtype=np.float32, lhs_quant=q[0], lhs_scales=np.ones(8, np.float32),
                               rhs_quant=q[1], rhs_scales=np.ones(4, np.float32))
    return gmm_ref.Problem("ragged_m", np.ones((8, 2), np.float32), rhs, np.array([8, 0]),
                           convention=convention, **kw)


#: adapters with XLA's CPU ragged_dot leak (torch.grouped_mm's poisoned issue: test_torch_cpu_leak.py)
LEAKY = [a for a in ADAPTERS if any(k.primitive == "ragged_dot_general" and k.applies() for k in a.known_issues)]


@pytest.mark.parametrize("adapter", LEAKY, ids=[a.name for a in LEAKY])
def test_declared_nan_leak_still_reproduces(adapter):
    """If upstream fixes the leak this fails: then drop the known_issues entry."""
    if adapter.available():
        pytest.skip(adapter.available())
    p = _nan_leak_problem(adapter.convention)
    with pytest.raises(gmm_ref.Mismatch) as info:
        gmm_ref.assert_matches_reference(adapter.run(p), p, kernel=adapter.name)
    assert info.value.kind == "nonfinite" and info.value.groups == (0,)


@pytest.mark.parametrize("name", ["megablox.gmm", "torch.grouped_mm", "ejkernel.grouped_matmul[pallas]"])
def test_kernels_without_the_leak_pass_the_same_problem(name):
    adapter = gmm_kernels.get(name)
    if adapter.available():
        pytest.skip(adapter.available())
    conv = adapter.convention
    p = _nan_leak_problem(conv)
    if conv == "torch.grouped_mm":  # 16-byte rows: K = N = 4
        rhs = np.stack([np.ones((4, 4), np.float32), np.full((4, 4), np.nan, np.float32)])
        p = gmm_ref.Problem("ragged_m", np.ones((8, 4), np.float32), rhs, np.array([8, 0]),
                            convention=conv, tail="undefined")
    assert not any(k.primitive == "ragged_dot_general" for k in adapter.known_issues)
    gmm_ref.assert_matches_reference(adapter.run(p), p, kernel=name)


def test_a_refusal_of_one_option_does_not_hide_another():
    """ejkernel's grouped_matmulv2 takes sharded groups but no existing output: a problem with both is
    refused for the existing output (a sharded problem must not end the refusal with None)."""
    v2 = gmm_kernels.get("ejkernel.grouped_matmul[pallas_v2]")
    rhs = np.ones((2, 8, 8), np.float32)
    sharded = gmm_ref.Problem("ragged_m", np.ones((8, 8), np.float32), rhs, np.array([4, 0, 4, 0]),
                              group_offset=2, num_local_groups=2, tiling=(8, 8, 8), convention="megablox.gmm",
                              tail="undefined")
    assert v2.supports(sharded) is None
    why = v2.supports(sharded.replace(existing_out=np.zeros((8, 8), np.float32)))
    assert why is not None and "NotImplementedError for existing_out" in why, why


def test_the_megablox_default_tiling_has_one_owner():
    """The convention's default_tiling is what a megablox-convention kernel is called with when no tiling is given:
    the one value gmm_ref.conventions.megablox defines, not a copy that could drift."""
    import inspect

    from gmm_kernels.adapters.megablox import EjkernelGroupedMatmul, MegabloxGmm, MegabloxTgmm, gmm_grads

    owner = gmm_ref.conventions.get("megablox.gmm").default_tiling
    assert owner is not None and gmm_ref.conventions.get("megablox.tgmm").default_tiling is owner
    for adapter_call in (MegabloxGmm.call, MegabloxTgmm.call, EjkernelGroupedMatmul.call, gmm_grads):
        assert inspect.signature(adapter_call).parameters["tiling"].default is owner, adapter_call


def test_a_variant_adapter_names_itself_by_its_op_and_implementation():
    from gmm_kernels.base import VariantAdapter

    class New(VariantAdapter):
        op, implementations, convention = "pkg.op", ("xla", "fast"), "ragged_dot"

    assert (New("fast").name, New().name) == ("pkg.op[fast]", "pkg.op[xla]")
    assert [a.name for a in gmm_kernels.registry() if a.name.startswith("tokamax.ragged_dot[")] == [
        "tokamax.ragged_dot[xla]", "tokamax.ragged_dot[mosaic]", "tokamax.ragged_dot[triton]",
        "tokamax.ragged_dot[xla,QArray]"]


def _routings_are_taken(adapter):
    """A routed kernel's form of the test above: every mode with a routed form draws routings the kernel takes
    (a repeat of an expert is declined where the convention excludes one, so it is never drawn there)."""
    from property_tests.checks.modes import Unsupported, mode_routings

    declined, drawn = [], []
    for mode in MODES.values():
        if mode.routed_values is None:
            continue
        try:
            strategy = mode_routings(adapter, mode)
        except Unsupported:  # the graph mode of a backward kernel
            continue

        @settings(max_examples=10, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(r=strategy)
        def prop(r):
            drawn.append(mode.name)  # noqa: B023 - prop runs within this iteration
            for one in r if isinstance(r, tuple) else (r,):  # the graph mode: routings of one shape in turn
                why = adapter.supports(one)
                if why:
                    declined.append(f"{mode.name}: {why}")  # noqa: B023 - prop runs within this iteration

        prop()
    forward = [] if adapter.convention_facts.backward else ["graph"]
    assert sorted(set(drawn)) == sorted(["exact", "normal", "poisoned", "wide", *forward])
    assert not declined, f"{len(declined)} of {len(drawn)} routings: {declined[:3]}"
