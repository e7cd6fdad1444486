"""Check a kernel against the reference: the modes, the property runner, ``check_kernel``.

A *mode* is one kind of input a kernel must get right (exact integers bit for
bit, normal values within the bound, poisoned padding, all groups empty,
sharded groups with and without an existing output, other output dtypes).
Each mode is a Hypothesis property over the problems of one family that the
kernel's convention can express; a failure raises :class:`gmm_ref.Mismatch`
for the shrunk problem with the report and a reproducer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
import zlib

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import InvalidArgument
from hypothesis import strategies as st

import gmm_ref

__all__ = ["FAMILIES_BY_CONVENTION", "MODES", "Mode", "check_kernel", "check_mode", "mode_strategy"]

FAMILIES_BY_CONVENTION = {
    "ragged_dot": ("ragged_m",),
    "ragged_dot_general": ("ragged_m", "ragged_k", "batch"),
    "megablox.gmm": ("ragged_m",),
    "megablox.tgmm": ("ragged_k",),
    "torch.grouped_mm": ("ragged_m", "ragged_n", "ragged_k", "batch"),
    "te.grouped_gemm": ("ragged_m", "ragged_n", "ragged_k"),
}


@dataclass(frozen=True)
class Mode:
    """One kind of input; ``options`` go to :func:`property_tests.strategies.problems`."""

    name: str
    doc: str
    options: dict[str, Any] = field(default_factory=dict)
    needs_sharding: bool = False


MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode("exact", "small integers: the result is exact, so it must match bit for bit",
             {"values": "integers"}),
        Mode("normal", "normal values within the per-element bound", {"values": "normal"}),
        Mode("wide", "subnormals up to values near the output's overflow, within the bound",
             {"values": "wide"}),
        Mode("poisoned", "NaN/Inf in rows and columns of no group must not reach the output",
             {"values": "poisoned"}),
        Mode("all_empty", "every group empty: the output is all tail / all zero blocks",
             {"values": "integers", "all_empty": True}),
        Mode("many_groups", "9 to 64 groups: more groups than tiles, indices past small fixed tables",
             {"values": "exact", "min_groups": 9, "max_groups": 64}),
        Mode("sharded", "group_offset / num_local_groups without an existing output",
             {"values": "integers", "sharding": True}, needs_sharding=True),
        Mode("sharded_existing", "sharded groups writing into an existing output",
             {"values": "integers", "sharding": True, "existing_out": True},
             needs_sharding=True),
        Mode("grad", "reverse-mode gradients w.r.t. lhs, rhs and existing_out, against gmm_ref.gradients",
             {"values": "normal", "dtypes": ("float32", "bfloat16")}),
        Mode("out_dtype", "every output dtype the convention takes, exact shape and dtype",
             {"values": "normal", "vary_out_dtype": True}),
    )
}

SHARDING_CONVENTIONS = ("megablox.gmm", "megablox.tgmm")


def mode_reason(convention: str, mode: Mode) -> str | None:
    """None if ``convention`` can express ``mode`` at all, else why not."""
    if mode.needs_sharding and convention not in SHARDING_CONVENTIONS:
        return f"{convention} has no group_offset (no sharded groups)"
    return None


def mode_strategy(adapter: Any, mode: Mode, family: str | None = None) -> st.SearchStrategy:
    """Problems in ``adapter``'s convention for ``mode``, within what it supports."""
    from property_tests import strategies as gst

    kwargs = dict(mode.options)
    tiling = getattr(adapter, "tiling", None)
    declared = adapter_constraints(adapter)
    # group counts: the mode's range narrowed to what the kernel takes; other options: the kernel's
    lo = max(kwargs.get("min_groups", 1), declared.pop("min_groups", 1))
    hi = min(kwargs.get("max_groups", 8), declared.pop("max_groups", 1 << 30))
    if lo > hi:
        raise Unsupported(f"{adapter.name} takes at most {hi} groups; the {mode.name} mode needs {lo}")
    kwargs.update(declared, min_groups=lo, max_groups=hi)
    if tiling is not None:
        kwargs["tiling"] = tiling
    if family is not None:
        kwargs["families"] = (family,)
    return gst.problems(convention=adapter.convention, **kwargs)


def adapter_constraints(adapter: Any) -> dict[str, Any]:
    """Strategy options an adapter declares (``strategy_options()``), if any."""
    fn = getattr(adapter, "strategy_options", None)
    return dict(fn()) if callable(fn) else {}


def _profile(name: str) -> settings:
    from property_tests.plugin import register_profiles

    register_profiles()  # outside pytest too (idempotent)
    return settings.get_profile(name)


def _settings(max_examples: int | None, profile: str | None = None) -> settings:
    base = _profile(profile) if profile else settings()
    return settings(
        base,
        max_examples=max_examples if max_examples is not None else base.max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


class Unsupported(Exception):
    """The kernel cannot take any problem of this mode/family; ``str()`` is the reason."""


def check_mode(adapter: Any, mode: Mode | str, *, family: str | None = None,
               max_examples: int | None = None, profile: str | None = None) -> int:
    """Run one mode's property on ``adapter``; raise Mismatch on failure. Returns examples checked.

    ``profile`` names a registered Hypothesis profile to run under (default: the one loaded).

    Raises :class:`Unsupported` if the convention cannot express the mode or
    the adapter declines every problem drawn.
    """
    __tracebackhide__ = True
    mode = MODES[mode] if isinstance(mode, str) else mode
    why = mode_reason(adapter.convention, mode)
    if why:
        raise Unsupported(why)
    checked = [0]
    declined: list[str] = []
    cap = getattr(adapter, "max_examples", None)  # slow kernels (e.g. interpreted GPU) cap their examples
    if cap is not None:
        default = (_profile(profile) if profile else settings()).max_examples
        max_examples = min(cap, max_examples if max_examples is not None else default)

    @given(problem=mode_strategy(adapter, mode, family))
    @_settings(max_examples, profile)
    def prop(problem: gmm_ref.Problem) -> None:
        reason = adapter.supports(problem)
        if reason is not None:
            declined.append(reason)
            return
        if mode.name == "grad":
            try:
                _check_gradients(adapter, problem)
            except NotImplementedError as exc:
                declined.append(str(exc))
                return
            checked[0] += 1
            return
        checked[0] += 1
        out = adapter.run(problem)
        ref = problem.reference()
        gmm_ref.assert_matches_reference(out, ref, numerics=adapter.numerics_for(problem), kernel=adapter.name)
        if mode.name == "exact" and getattr(adapter, "deterministic", False):
            again = np.asarray(adapter.run(problem))
            defined = ref.mask  # undefined elements may differ run to run
            if not np.array_equal(np.asarray(out)[defined].view(np.uint8), again[defined].view(np.uint8)):
                raise gmm_ref.Mismatch(
                    f"kernel {adapter.name} is declared deterministic but two runs of "
                    f"{problem.describe()} differ bit-wise", kind="determinism")

    try:
        prop()
    except InvalidArgument as exc:  # the strategies cannot draw this mode for this convention
        raise Unsupported(f"no {mode.name} problems in {adapter.convention}: {exc}") from None
    if checked[0] == 0:
        reason = max(set(declined), key=declined.count) if declined else "no problem drawn"
        raise Unsupported(f"{adapter.name} declined every problem: {reason}")
    return checked[0]


def cotangent_for(problem: gmm_ref.Problem) -> np.ndarray:
    """A cotangent for ``problem``'s output: normal values in the output dtype, seeded by the inputs."""
    seed = zlib.crc32(problem.lhs.tobytes()[:4096] + problem.rhs.tobytes()[:4096])
    rng = np.random.default_rng(seed)
    return gmm_ref.round_to(rng.standard_normal(problem.out_shape), problem.out_dtype)


def _check_gradients(adapter: Any, problem: gmm_ref.Problem) -> None:
    """Compare ``adapter.vjp`` with gmm_ref's exact gradients (each its own problem and bound)."""
    __tracebackhide__ = True
    cot = cotangent_for(problem)
    got = adapter.vjp(problem, cot)  # NotImplementedError: this kernel has no gradient
    want = gmm_ref.gradients(problem, cot)
    skip = getattr(adapter, "known_gradient_issues", None) or {}
    for wrt, value in got.items():
        if wrt in skip:  # a declared upstream bug, pinned by its own strict-xfail test
            continue
        gp = want[wrt]
        gmm_ref.assert_matches_reference(value, gp, numerics=adapter.numerics_for(gp),
                                         kernel=f"{adapter.name} d/d{wrt}")


def check_kernel(
    fn: Callable[..., Any] | Any,
    *,
    convention: str | None = None,
    tiling: tuple[int, int, int] | None = None,
    max_examples: int | None = None,
    modes: Iterable[str] | None = None,
    numerics: gmm_ref.Numerics | None = None,
    name: str | None = None,
    profile: str | None = None,
) -> dict[str, str]:
    """Check a kernel function (or a built-in adapter) in every mode its convention allows.

    ``fn`` receives exactly its convention's arguments (jax arrays for the
    jax conventions, torch tensors for ``torch.grouped_mm``) and may return a
    jax array, torch tensor or NumPy array. Raises :class:`gmm_ref.Mismatch`
    (an AssertionError) for the first failing mode, after shrinking; returns
    ``{mode: "pass" | "unsupported: reason"}`` otherwise. ``profile`` names a
    registered Hypothesis profile (``"ci"``, ``"dev"``, ``"thorough"``) to run under.
    """
    __tracebackhide__ = True
    from gmm_kernels import KernelAdapter, wrap

    if isinstance(fn, KernelAdapter):
        adapter = fn
    else:
        if convention is None:
            raise TypeError("convention: required when checking a function; expected one of "
                            f"{gmm_ref.CONVENTIONS}")
        adapter = wrap(fn, convention, name=name, numerics=numerics)
    if tiling is not None:
        adapter.tiling = tuple(tiling)
    why = adapter.available()
    if why:
        return {m: f"unsupported: {why}" for m in (modes or MODES)}
    results: dict[str, str] = {}
    for m in modes or MODES:
        if m not in MODES:
            raise ValueError(f"modes: unknown mode {m!r}; expected some of {sorted(MODES)}")
        try:
            check_mode(adapter, m, max_examples=max_examples, profile=profile)
            results[m] = "pass"
        except Unsupported as exc:
            results[m] = f"unsupported: {exc}"
    return results
