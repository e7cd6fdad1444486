"""Graph safety: group sizes are device data inside ``jax.jit``, so one compilation must serve
every size vector of a shape. Shown for ``jax.lax.ragged_dot`` and megablox ``gmm``; a kernel
that bakes the sizes in as static values must be caught by the same check.
"""

from __future__ import annotations

import numpy as np
import pytest

import gmm_ref
from gmm_kernels.sandbox.compilation import CompileCounter, Recompiled, assert_compiles_once
from gmm_ref import as_numpy as to_numpy

jax = pytest.importorskip("jax")
jnp = jax.numpy

M, K, N, G = 32, 16, 24, 4
TILING = (8, 8, 8)
# empty groups first / middle / last, all empty, one group takes all, a tail, sizes off tile edges
SIZE_VECTORS = [
    [8, 8, 8, 8], [0, 0, 0, 0], [0, 32, 0, 0], [3, 0, 9, 20], [1, 7, 9, 0], [0, 5, 0, 11], [31, 0, 0, 1],
]


def _operands():
    rng = np.random.default_rng(0)
    return (rng.integers(-3, 4, (M, K)).astype(np.float32), rng.integers(-3, 4, (G, K, N)).astype(np.float32))


def _make_args(sizes):
    lhs, rhs = _operands()
    return jax.device_put(lhs), jax.device_put(rhs), jax.device_put(np.asarray(sizes, np.int32))


def _check_against_reference(tail: str):
    def check(sizes, out, args):
        lhs, rhs = _operands()
        p = gmm_ref.Problem("ragged_m", lhs, rhs, np.asarray(sizes), out_dtype=np.float32, tail=tail)
        gmm_ref.assert_matches_reference(np.asarray(out), p)
    return check


def _traced_counter():
    calls = {"traces": 0}
    return calls


def test_ragged_dot_compiles_once():
    traces = _traced_counter()

    @jax.jit
    def f(a, b, g):
        traces["traces"] += 1  # Python side effect: runs once per trace
        return jax.lax.ragged_dot(a, b, g)

    assert_compiles_once(f, _make_args, SIZE_VECTORS, name="jax.lax.ragged_dot",
                         check=_check_against_reference("zero"))
    assert traces["traces"] == 1


def test_megablox_gmm_compiles_once():
    from gmm_kernels.adapters.megablox import backend_module

    gmm = backend_module().gmm
    traces = _traced_counter()

    @jax.jit
    def f(a, b, g):
        traces["traces"] += 1
        return gmm(a, b, g, jnp.float32, TILING, interpret=True)

    assert_compiles_once(f, _make_args, SIZE_VECTORS, name="megablox gmm",
                         check=_check_against_reference("undefined"))
    assert traces["traces"] == 1


def test_the_counter_sees_compilations():
    with CompileCounter() as c:
        jax.jit(lambda x: x * 3 + 1)(jnp.arange(7.0)).block_until_ready()
    assert c.compiles >= 1 and c.traces >= 1
    with CompileCounter() as c:
        pass
    assert (c.compiles, c.traces) == (0, 0)


def test_static_sizes_kernel_is_caught():
    """A kernel that turns device sizes into a static tuple recompiles per size vector."""

    @jax.jit
    def _static(a, b, sizes_tuple):
        return jax.lax.ragged_dot(a, b, jnp.asarray(sizes_tuple, jnp.int32))

    static = jax.jit(_static.__wrapped__, static_argnums=2)

    def baked(a, b, g):  # host sync, then a static argument: one program per size vector
        return static(a, b, tuple(int(v) for v in np.asarray(g)))

    with pytest.raises(Recompiled) as info:
        assert_compiles_once(baked, _make_args, SIZE_VECTORS[:3], name="baked-sizes kernel",
                             check=_check_against_reference("zero"))
    msg = str(info.value)
    assert "baked-sizes kernel is not graph-safe" in msg
    assert "group_sizes=[0, 0, 0, 0]: 1 backend compilation(s)" in msg
    assert "group_sizes=[0, 32, 0, 0]: 1 backend compilation(s)" in msg


def test_sizes_as_static_jit_argument_is_caught():
    """The other way to bake sizes in: a jitted function with the sizes in static_argnums."""
    def f(a, b, g):
        return jax.lax.ragged_dot(a, b, jnp.asarray(g, jnp.int32))

    static = jax.jit(f, static_argnums=2)

    def make_args(sizes):
        lhs, rhs = _operands()
        return jax.device_put(lhs), jax.device_put(rhs), tuple(int(v) for v in sizes)

    with pytest.raises(Recompiled, match="group_sizes=\\[3, 0, 9, 20\\]"):
        assert_compiles_once(static, make_args, [[8, 8, 8, 8], [3, 0, 9, 20]], name="static_argnums kernel")


def test_torch_grouped_mm_replays_in_a_cuda_graph_with_new_sizes():
    """Capture ``torch._grouped_mm`` once in a CUDA graph; replay it with new offsets written
    into the captured tensor: every replay must match the reference (no host round trip)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: capturing torch._grouped_mm in a CUDA graph needs a GPU")
    m, k, n, g = 256, 64, 128, 4
    rng = np.random.default_rng(0)
    a = torch.from_numpy(rng.integers(-3, 4, (m, k)).astype(np.float32)).to(torch.bfloat16).cuda()
    b = torch.from_numpy(rng.integers(-3, 4, (g, k, n)).astype(np.float32)).to(torch.bfloat16).cuda()
    offs = torch.tensor([64, 128, 192, 256], dtype=torch.int32, device="cuda")
    torch._grouped_mm(a, b.transpose(-2, -1).contiguous().transpose(-2, -1), offs=offs)  # warm up
    graph = torch.cuda.CUDAGraph()
    b_cm = b.transpose(-2, -1).contiguous().transpose(-2, -1)  # column-major weights, as CUDA wants
    with torch.cuda.graph(graph):
        out = torch._grouped_mm(a, b_cm, offs=offs)
    for sizes in ([64, 64, 64, 64], [0, 0, 256, 0], [1, 127, 0, 128], [0, 0, 0, 0], [17, 0, 33, 100]):
        offs.copy_(torch.tensor(np.cumsum(sizes), dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        got = to_numpy(out)
        ref = gmm_ref.grouped_mm(to_numpy(a), to_numpy(b), offs=offs.cpu().numpy(), with_reference=True)
        gmm_ref.assert_matches_reference(got, ref, kernel=f"torch._grouped_mm CUDA graph replay, sizes {sizes}")
