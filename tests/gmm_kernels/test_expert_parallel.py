"""Expert parallelism for real: megablox ``gmm`` under ``jax.shard_map`` over 8 virtual CPU devices.

Each device holds ``L = G / 8`` experts' weights and runs ``gmm`` (interpret
mode) on the whole token buffer with ``group_offset = device * L``: rows of
other experts come out zero, so a ``psum`` over the mesh is the full grouped
GEMM, which must match the reference for the full (unsharded) problem bit for
bit. A variant that ignores ``group_offset`` must be rejected. The repository
``conftest.py`` sets ``--xla_force_host_platform_device_count=8`` before jax
is imported (in every pytest-xdist worker too).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gmm_ref
from property_tests import strategies as gst

jax = pytest.importorskip("jax")

DEVICES = 8
LOCAL = 2  # experts per device
G = DEVICES * LOCAL
M, K, N = 64, 16, 24
TILING = (8, 8, 8)


def _mesh():
    devices = jax.devices("cpu")
    if len(devices) < DEVICES:
        pytest.fail(f"expected {DEVICES} virtual CPU devices, found {len(devices)}: XLA_FLAGS="
                    "--xla_force_host_platform_device_count=8 must be set before jax is imported "
                    "(the repository conftest.py does it)")
    return jax.sharding.Mesh(np.array(devices[:DEVICES]), ("ep",))


@functools.cache
def _expert_parallel_gmm(honour_group_offset: bool):
    """jit(shard_map(gmm)): lhs and sizes replicated, rhs [G, K, N] split over 'ep', psum of the outputs."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from gmm_kernels.adapters.megablox import backend_module

    gmm = backend_module().gmm

    def local(lhs, rhs_local, sizes):
        go = jax.lax.axis_index("ep").astype(jnp.int32) * LOCAL if honour_group_offset else None
        out = gmm(lhs, rhs_local, sizes, jnp.float32, TILING, go, interpret=True)
        return jax.lax.psum(out, "ep")

    fn = jax.shard_map(local, mesh=_mesh(), in_specs=(P(), P("ep"), P()), out_specs=P(), check_vma=False)
    return jax.jit(fn)


@st.composite
def expert_problems(draw):
    """The full problem: G = 16 experts over 64 tokens; sizes and small-integer values vary.

    Shrinks towards sizes of 0 (a zero tail past sum(sizes)) and all-ones operands.
    """
    sizes = draw(gst.group_sizes(num_groups=G, extent=M, tile=TILING[0]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if seed == 0:
        lhs, rhs = np.ones((M, K), np.float32), np.ones((G, K, N), np.float32)
    else:
        lhs = rng.integers(-3, 4, size=(M, K)).astype(np.float32)
        rhs = rng.integers(-3, 4, size=(G, K, N)).astype(np.float32)
    # every shard zeroes the rows it does not own, the tail included: the sum has a zero tail
    return gmm_ref.Problem("ragged_m", lhs, rhs, np.asarray(sizes), out_dtype=np.float32, tail="zero",
                           tiling=TILING)


def _run(problem: gmm_ref.Problem, honour_group_offset: bool = True) -> np.ndarray:
    out = _expert_parallel_gmm(honour_group_offset)(problem.lhs, problem.rhs,
                                                      problem.group_sizes.astype(np.int32))
    return np.asarray(out)


def test_eight_virtual_devices():
    assert len(jax.devices("cpu")) == DEVICES, jax.devices()
    assert "--xla_force_host_platform_device_count=8" in __import__("os").environ.get("XLA_FLAGS", "")


@settings(max_examples=8, deadline=None)
@given(problem=expert_problems())
def test_expert_parallel_gmm_matches_reference(problem):
    gmm_ref.assert_matches_reference(_run(problem), problem, kernel="megablox.gmm x shard_map(8)")


def test_each_device_computes_only_its_experts():
    """The per-device outputs (before psum) are the sharded problems' references."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from gmm_kernels.adapters.megablox import backend_module

    rng = np.random.default_rng(1)
    sizes = np.array([3, 0, 5, 8, 1, 7, 0, 0, 9, 2, 4, 4, 6, 0, 3, 2], np.int32)  # sum 54 < 64: a tail
    full = gmm_ref.Problem("ragged_m", rng.integers(-3, 4, (M, K)).astype(np.float32),
                           rng.integers(-3, 4, (G, K, N)).astype(np.float32), sizes, out_dtype=np.float32)

    def local(lhs, rhs_local, gs):
        go = jax.lax.axis_index("ep").astype(jnp.int32) * LOCAL
        return backend_module().gmm(lhs, rhs_local, gs, jnp.float32, TILING, go, interpret=True)[None]

    fn = jax.jit(jax.shard_map(local, mesh=_mesh(), in_specs=(P(), P("ep"), P()), out_specs=P("ep"),
                               check_vma=False))
    per_device = np.asarray(fn(full.lhs, full.rhs, sizes))
    assert per_device.shape == (DEVICES, M, N)
    for d in range(DEVICES):
        shard = full.replace(rhs=full.rhs[d * LOCAL:(d + 1) * LOCAL], group_offset=d * LOCAL,
                             num_local_groups=LOCAL, convention="megablox.gmm", tail="zero", foreign="zero")
        gmm_ref.assert_matches_reference(per_device[d], shard, kernel=f"megablox.gmm on device {d}")


def test_ignoring_group_offset_is_rejected():
    """Every device computing 'its' experts as experts 0..L-1 is caught, naming the wrong experts."""
    rng = np.random.default_rng(2)
    sizes = np.array([4] * G, np.int32)
    problem = gmm_ref.Problem("ragged_m", rng.integers(-3, 4, (M, K)).astype(np.float32),
                              rng.integers(-3, 4, (G, K, N)).astype(np.float32), sizes,
                              out_dtype=np.float32, tiling=TILING)
    gmm_ref.assert_matches_reference(_run(problem), problem)  # the correct program passes
    with pytest.raises(gmm_ref.Mismatch) as info:
        gmm_ref.assert_matches_reference(_run(problem, honour_group_offset=False), problem)
    assert info.value.groups == tuple(range(G)), info.value.groups
    assert "Mismatched elements:" in str(info.value)
