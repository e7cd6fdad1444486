"""The adapter template: one object per real grouped-GEMM kernel.

The base class does everything adapters share, from declarations:

- :meth:`~KernelAdapter.available`: the modules in ``requires`` are installed,
  then the subclass's :meth:`~KernelAdapter._unavailable`;
- :meth:`~KernelAdapter.supports`: the convention's refusal
  (``gmm_ref.conventions``), the dtype declarations (``input_dtypes``,
  ``output_dtypes``, ``equal_input_dtypes``, ``output_is_input``), then the
  subclass's :meth:`~KernelAdapter._refusal`;
- :meth:`~KernelAdapter.numerics_for`: exact products into the widest
  accumulator involved, flushed subnormals where ``flush_subnormals``, and jax's
  DEFAULT precision on GPU/TPU where ``default_precision``;
- :meth:`~KernelAdapter.run`: the problem as its convention's arguments, the
  kernel's output as NumPy; :meth:`~KernelAdapter.vjp` through
  :meth:`~KernelAdapter.differentiable_fn`.

A subclass states only what is its own: ``name``, ``convention``, how to call
the kernel (:meth:`~KernelAdapter.call`), a tiling or interpret mode, extra
refusals, and ``known_issues`` (the upstream bugs, with their repro and versions).
Nothing here imports jax or torch; subclasses import them lazily.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np

from gmm_kernels.known_issues import xla_nan_leak_issues
from gmm_kernels.runtimes import triton_bounds
from gmm_kernels.sandbox import autodiff, device, guards, inputs, tamper
from gmm_kernels.sandbox.context import guarded_arguments
from gmm_kernels.scope import KnownIssue, Limits, Scope
from gmm_ref import Numerics, Problem, Reference, conventions, reference
from gmm_ref.dtypes import as_numpy
from gmm_ref.numerics import default_numerics

__all__ = ["KernelAdapter", "KernelExit", "VariantAdapter", "dtype_name", "import_failure", "missing_module",
           "observe_calls", "on_accelerator", "torch_operators", "watched_call"]


_observers: list[Callable[[Any, Problem], None]] = []


class KernelExit(RuntimeError):
    """A kernel raised ``SystemExit`` (it called ``sys.exit``): a failure of the problem it was given, shrunk and
    reported like any error, never the end of the run or of the process checking it."""


@contextlib.contextmanager
def watched_call(name: str) -> Iterator[None]:
    """The context of every call of the kernel ``name``: a ``SystemExit`` it raises fails the problem it was given
    (:class:`KernelExit`), never the run; what it changed outside its arguments (the harness's functions, threads
    left running) is a failure too (``sandbox.tamper``)."""
    with tamper.watched(name), triton_bounds.reported(name):  # an access out of bounds: the harness's finding
        try:
            yield
        except SystemExit as exc:
            raise KernelExit(f"the kernel raised SystemExit({exc.code!r}) (sys.exit)") from exc


def _observed(adapter: Any, problem: Any) -> None:
    for observer in tuple(_observers):  # the main job's worker: the last problem given, if the kernel crashes
        observer(adapter, problem)


#: the package of the built-in adapters, whose compiled executables ``gmm_kernels.runtimes.executables`` may keep
_BUILTIN_ADAPTERS = "gmm_kernels.adapters."


def observe_calls(observer: Callable[[Any, Problem], None]) -> Callable[[], None]:
    """Call ``observer(adapter, problem)`` before every kernel call (a routed kernel: ``observer(adapter, routing)``);
    returns the function that stops it.

    The main job records the last problem given to a kernel, so that a kernel which hangs or
    kills the process is reported with it."""
    _observers.append(observer)
    return lambda: _observers.remove(observer)


def missing_module(*modules: str) -> str | None:
    """The reason the first of ``modules`` that cannot be found is missing, else None."""
    for mod in modules:
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"{mod.split('.')[0]} is not installed"
    return None


def import_failure(module: str, attr: str | None, what: str) -> str | None:
    """Why ``module`` (and its ``attr``, if given) cannot be imported here (``what`` names it in the reason),
    else None."""
    try:
        found = importlib.import_module(module)
        if attr is not None:
            getattr(found, attr)
    except Exception as exc:  # noqa: BLE001 - an import that fails here is the reason it cannot run
        return f"{what} does not import here: {exc}"
    return None


def dtype_name(dt: Any) -> str:
    """A dtype's short name (``float32``, ``bfloat16``)."""
    return str(np.dtype(dt))


def on_accelerator(numerics: Numerics, problem: Problem) -> Numerics:
    """``numerics`` as jax's DEFAULT precision makes them on the backend in use: on TPU float32
    operands pass through bfloat16, on recent GPUs through TF32 (declared as bfloat16, whose
    shorter significand gives a sound, slightly looser bound). CPU multiplies them exactly.
    Never imports jax: a process that has not imported it runs no jax kernel."""
    import sys

    if numerics.multiply is not None or np.issubdtype(problem.lhs.dtype, np.integer):
        return numerics
    jax = sys.modules.get("jax")
    try:
        backend = jax.default_backend() if jax is not None else "cpu"
    except Exception:  # noqa: BLE001 - no backend at all
        backend = "cpu"
    if backend == "cpu":
        return numerics
    return dataclasses.replace(numerics, multiply="bfloat16")


def torch_operators(fn: Callable[..., Any], args: tuple, kwargs: dict) -> frozenset[str]:
    """The torch operators ``fn(*args, **kwargs)`` dispatches to, named as ``torch.ops`` names their overload
    packets (``aten._grouped_mm``, ``aten.mm``), recorded by a ``TorchDispatchMode`` while it runs; those it
    reached before it raised, if it raises."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            seen.add(str(getattr(func, "overloadpacket", func)))
            return func(*args, **(kwargs or {}))

    try:
        with _Record():
            fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - a kernel that raises says what it called until then
        pass
    return frozenset(seen)


class _Interpreted(str):
    """A :meth:`KernelAdapter.large_refusal` saying that the kernel runs interpreted here, and how."""

    how: str

    def __new__(cls, text: str, how: str) -> _Interpreted:
        self = super().__new__(cls, text)
        self.how = how
        return self


class KernelAdapter:
    """Base class of every adapter (see the module docstring for what it does)."""

    name: ClassVar[str] = "abstract"
    convention: ClassVar[str] = ""
    #: modules that must be installed for the kernel to run here
    requires: ClassVar[tuple[str, ...]] = ()
    #: what the kernel needs beyond its modules (a GPU, say): added to the reason a required module is missing
    needs: ClassVar[str] = ""
    #: input dtypes the kernel takes (None: whatever its convention takes)
    input_dtypes: ClassVar[tuple[str, ...] | None] = None
    #: output dtypes the kernel returns (None: whatever its convention takes)
    output_dtypes: ClassVar[tuple[str, ...] | None] = None
    equal_input_dtypes: ClassVar[bool] = False
    output_is_input: ClassVar[bool] = False
    #: subnormal inputs, products, partial sums and outputs may be flushed to zero (XLA does)
    flush_subnormals: ClassVar[bool] = False
    #: float32 products follow jax's DEFAULT precision (bfloat16 passes on TPU, TF32 on GPU)
    default_precision: ClassVar[bool] = False
    deterministic: ClassVar[bool] = True
    #: a routed MoE kernel (:class:`RoutedKernelAdapter`): checked on routings, not grouped problems
    routed: ClassVar[bool] = False
    #: a per-mode example budget for slow kernels (None: the profile's)
    max_examples: ClassVar[int | None] = None
    #: upstream bugs that make the kernel fail some modes, with the versions they are known on
    #: (strict xfail in the plugin's checks, "known bug" cell in the main job, where they apply; not caught: a failure)
    known_issues: ClassVar[tuple[KnownIssue, ...]] = ()
    #: input ("lhs", "rhs", "existing_out") -> the upstream bug in its gradient
    known_gradient_issues: ClassVar[dict[str, KnownIssue]] = {}
    #: why the kernel copies a strided operand contiguous before its own arithmetic (None: it reads its operands
    #: through their strides): the large mode's strided cells would check the copy, so it gets none of them
    copies_strided: ClassVar[str | None] = None
    #: ``(lhs, rhs)`` ``gmm_ref.MXQuantizer`` (or None) of a kernel that quantizes its high-precision inputs
    #: itself: it is held to the reference of its inputs quantized so (:meth:`reference_problem`)
    quantizes: ClassVar[tuple[Any, Any] | None] = None
    # the run state: set once, when the kernel is resolved, by gmm_kernels.resolve.configure (which returns a
    # configured copy), never assigned anywhere else
    #: the tiling ``(TM, TK, TN)`` it is run with (None: its convention's default)
    tiling: tuple[int, int, int] | None = None
    #: what the kernel declares it supports within its convention (None: all of it)
    scope: Scope | None = None
    #: the spec it was resolved from (a built-in name or pkg.module:obj), for reproducers
    origin: str | None = None
    #: the kernel's version recorded with its goldens (``--kernel-version``; None: its installed package's)
    version: str | None = None

    # ------------------------------------------------------------- capability
    @property
    def convention_facts(self) -> conventions.Convention:
        """The :class:`gmm_ref.conventions.Convention` record this kernel is called in (``convention`` is its
        name), as ``Problem.family_facts`` is the record of ``Problem.family``."""
        return conventions.get(self.convention)

    @property
    def families(self) -> tuple[str, ...]:
        """The families the kernel is checked in: its convention's, narrowed by its :meth:`_limits` and scope."""
        mine = self.convention_facts.families if self.scope is None else self.scope.families_in(self.convention_facts)
        own = self._limits().families
        return mine if own is None else tuple(f for f in mine if f in own)

    def known_issue(self, mode: str) -> str | None:
        """The upstream bug that makes the kernel fail ``mode`` here, if one is declared and applies."""
        declared = (*self.known_issues, *(self.scope.known_issues if self.scope is not None else ()))
        return next((k.describe() for k in declared if mode in k.modes and k.applies()), None)

    def known_gradient_issue(self, wrt: str) -> str | None:
        """The upstream bug in the gradient w.r.t. ``wrt``, if one is declared and applies here."""
        issue = self.known_gradient_issues.get(wrt)
        return issue.describe() if issue is not None and issue.applies() else None

    def large_refusal(self) -> str | None:
        """Why the ``large`` mode's full-size cell (an operand past 2**31 elements) cannot run this kernel here, or
        None. Kernels that run interpreted on this machine say so (:meth:`_runs_interpreted`); the mode's strided
        cells (``property_tests.checks.large_strided``: a few blocks) run them all the same."""
        return None

    def _runs_interpreted(self, how: str = "Pallas interpret mode", takes: str = "hours") -> str:
        """The :meth:`large_refusal` of a kernel that runs interpreted here."""
        return _Interpreted(f"{self.name} runs interpreted here ({how}): an operand past 2**31 elements would take "
                            f"{takes}", how)

    def interpreted(self) -> str | None:
        """How this kernel runs interpreted on this machine (``"Pallas interpret mode"``), or None where it runs
        natively: the kernels whose :meth:`large_refusal` is :meth:`_runs_interpreted`'s. The ``scale`` mode
        gives them fewer cells (``property_tests.checks.scale``): each grid step of theirs costs milliseconds."""
        why = self.large_refusal()
        return why.how if isinstance(why, _Interpreted) else None

    def available(self) -> str | None:
        """None when the kernel can run here, else the reason it cannot."""
        missing = missing_module(*self.requires)
        if missing:
            return f"{missing} ({self.needs})" if self.needs else missing
        return self._unavailable()

    def supports(self, problem: Problem) -> str | None:
        """None when the kernel can take ``problem``, else the reason it cannot."""
        if problem.convention not in (None, self.convention):
            return f"{self.name} takes the {self.convention!r} convention, not {problem.convention!r}"
        return (self.convention_facts.refusal(problem)
                or self.dtype_refusal(problem.lhs.dtype, problem.rhs.dtype, problem.out_dtype)
                or (self.scope.refusal(problem) if self.scope is not None else None)
                or self._refusal(problem))

    def dtype_refusal(self, lhs: Any, rhs: Any, out: Any) -> str | None:
        """Why the kernel does not take these input and output dtypes, else None."""
        names = {"lhs": dtype_name(lhs), "rhs": dtype_name(rhs), "out": dtype_name(out)}
        if self.input_dtypes is not None:
            for operand in ("lhs", "rhs"):
                if names[operand] not in self.input_dtypes:
                    allowed = " / ".join(self.input_dtypes)
                    return f"{self.name} takes inputs of {allowed}, not {operand} {names[operand]}"
        if self.equal_input_dtypes and names["lhs"] != names["rhs"]:
            return f"{self.name} needs equal input dtypes, got {names['lhs']} x {names['rhs']}"
        if self.output_is_input and names["out"] != names["lhs"]:
            return f"{self.name} returns its input dtype {names['lhs']}, not {names['out']}"
        if self.output_dtypes is not None and names["out"] not in self.output_dtypes:
            return f"{self.name} returns {' / '.join(self.output_dtypes)}, not {names['out']}"
        return None

    def numerics_for(self, problem: Problem) -> Numerics:
        """The arithmetic the kernel does for ``problem`` (bounds are derived from it)."""
        if self.scope is not None and self.scope.numerics is not None:
            return self.scope.numerics
        base = default_numerics(problem)
        numerics = dataclasses.replace(base, flush_subnormals=self.flush_subnormals)
        return on_accelerator(numerics, problem) if self.default_precision else numerics

    @property
    def declared_quantizes(self) -> tuple[Any, Any] | None:
        """The ``(lhs, rhs)`` format of a kernel that quantizes its inputs itself (its scope's, else its own
        ``quantizes``), or None."""
        return (self.scope.quantizes if self.scope is not None else None) or self.quantizes

    def reference_problem(self, problem: Problem) -> Problem:
        """The problem the kernel's output is judged against: ``problem`` itself, or, for a kernel that
        quantizes its inputs (:attr:`declared_quantizes`), ``problem`` quantized so."""
        quantizes = self.declared_quantizes
        if quantizes is None:
            return problem
        from gmm_ref import quantize_problem

        return quantize_problem(problem, *quantizes)

    def reference_for(self, problem: Problem) -> Reference:
        """The reference the kernel's output on ``problem`` is held to: ``gmm_ref.reference(problem)``, or for a
        kernel that quantizes its inputs, the reference of :meth:`reference_problem`, in which the output
        elements that a NaN or Inf of the high-precision inputs reaches are left undefined. There the
        quantizer's rules (an Inf saturates to the largest code, a NaN makes its block's scale NaN) and the
        kernel's dequantized arithmetic (a code times a large scale may overflow) legitimately differ; every
        other element is compared, so a NaN that leaks into other rows or groups is caught."""
        scaled = self.reference_problem(problem)
        ref = reference(scaled)
        if scaled is problem:
            return ref
        with np.errstate(invalid="ignore", over="ignore"):
            reached = ~np.isfinite(reference(problem).exact)
        return Reference(scaled, ref.exact, ref.mask & ~reached)

    def limits(self) -> Limits:
        """What the kernel takes within its convention, as facts (:class:`gmm_kernels.scope.Limits`): its own
        (:meth:`_limits`) narrowed by its scope, with the dtype pairs (those its dtype declarations and scope
        take) and the families it is checked in, each where fewer than its convention's (else None)."""
        own = self._limits().narrowed(self.scope)
        conv = self.convention_facts
        pairs = self.scope.dtype_pairs(conv) if self.scope is not None else conv.dtype_pairs
        mine = tuple(pr for pr in pairs if self.dtype_refusal(pr[0], pr[0], pr[1]) is None
                     and (own.dtypes is None or any(tuple(map(str, pr)) == tuple(map(str, d)) for d in own.dtypes)))
        families = self.families
        return dataclasses.replace(own, dtypes=mine if len(mine) < len(conv.dtype_pairs) else None,
                                   families=families if families != conv.families else None)

    # ------------------------------------------------------------------ hooks
    def _unavailable(self) -> str | None:
        return None

    def _refusal(self, problem: Problem) -> str | None:
        return None

    def _limits(self) -> Limits:
        """What the kernel itself takes within its convention (group counts, multiples, the features it
        refuses, ...), where less than the convention's: whatever :meth:`_refusal` declines for every
        problem of a kind, so that no problem of that kind is drawn for it."""
        return Limits()

    def option_refusal(self, option: str) -> str | None:
        """Why the kernel takes none of the problems with the feature ``option`` (one of
        ``gmm_kernels.scope.FEATURES``: ``"sharding"``, ``"existing_out"``), where its :meth:`_limits`
        refuse it; else None."""
        return None

    # ---------------------------------------------------------------- running
    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Run the kernel on its convention's arguments (NumPy); return its output."""
        raise NotImplementedError

    def invoke(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`call`, as every caller of the kernel makes it: a ``SystemExit`` the kernel raises becomes a
        :class:`KernelExit`, a failure of this call (:meth:`vjp` runs the kernel's gradient the same way)."""
        with watched_call(self.name):
            return self.call(*args, **kwargs)

    def run(self, problem: Problem) -> np.ndarray:
        """Run the kernel on copies of ``problem``'s arguments in this adapter's convention; the output
        as NumPy. ``gmm_ref.Mismatch`` if the kernel wrote to an input."""
        with self.arguments(problem) as (args, kwargs):
            out = self.invoke(*args, **kwargs)
            if self.convention_facts.framework == "torch":
                device.synchronize()  # on CUDA: the kernel's queued work done (and its errors raised) before judging
            if out is None and self.convention_facts.out_argument is not None:  # it wrote its output buffer in place
                out = self.convention_facts.out_value(args, kwargs)  # a host array: the device's copied back on exit
        return as_numpy(out, name=f"output of {self.name}", strict=True)

    @contextlib.contextmanager
    def arguments(self, problem: Problem) -> Iterator[tuple[tuple, dict]]:
        """Fresh guarded copies of ``problem``'s arguments for one call (``sandbox.context.guarded_arguments``); on
        leaving, ``gmm_ref.Mismatch`` if the kernel wrote past a buffer into its guard region or changed any of its
        inputs."""
        pristine = self.convention_facts.arguments(self._own(problem))
        with guarded_arguments(self.name, self.convention_facts, pristine, lambda: _observed(self, problem)) as given:
            yield given

    def guarded_reads(self, problem: Problem, out: Any, bad: np.ndarray | None) -> list[str]:
        """What a failing call read outside its operands, told by their guard regions (``gmm_kernels.sandbox.guards``);
        ``out`` the call's output, ``bad`` the mask of its wrong elements. Empty where nothing is told.

        The call is rerun with one operand's margins made neutral (zeros) at a time (then all the float ones at
        once): a float operand is blamed where wrong elements that are NaN in ``out`` are no longer NaN with its
        margins neutral (its NaN guard reached the output); an integer operand (offsets, group sizes) where the
        wrong elements change with only its sentinel margins changed. A correct kernel's output does not depend on
        memory outside its operands, so it is never blamed, and one more rerun with the margins as they were must
        give the same failing elements again (a kernel whose failures vary from call to call is blamed for nothing).
        Costs nothing on a passing call: it is only called on a failure."""
        out = np.asarray(out)
        if bad is None or bad.shape != out.shape or not bad.any():
            return []
        pristine = self.convention_facts.arguments(self._own(problem))
        with guards.call(self.name) as probe:
            inputs.fresh(*pristine, convention=self.convention_facts, guard=probe)
        floats = [g.name for g in probe.guards if g.poison == "NaN"]
        ints = [g.name for g in probe.guards if g.poison != "NaN"]

        def rerun(neutral: dict[str, tuple[str, ...]]) -> np.ndarray | None:
            try:
                with guards.neutral(neutral), np.errstate(all="ignore"):
                    return np.asarray(self.run(problem))
            except Exception:  # noqa: BLE001 - a rerun that fails tells nothing
                return None

        def nan(x: np.ndarray) -> np.ndarray:
            return np.isnan(x.astype(np.float64)) if x.dtype.kind not in "iub" else np.zeros(x.shape, bool)

        def bits(x: np.ndarray) -> bytes:
            return np.ascontiguousarray(x[bad]).tobytes()

        both = ("before", "after")
        poisoned = bad & nan(out)
        lines = []
        if poisoned.any():
            def cleared(o: np.ndarray | None) -> int:
                return int((~nan(o)[poisoned]).sum()) if o is not None and o.shape == out.shape else 0

            blamed = [n for n in floats if cleared(rerun({n: both}))]
            joint = not blamed and len(floats) > 1 and cleared(rerun(dict.fromkeys(floats, both))) > 0
            again = rerun({}) if blamed or joint else None
            if again is not None and again.shape == out.shape and nan(again)[poisoned].all():
                if joint:
                    lines.append(f"read outside several of {', '.join(floats)} (their NaN guards reached the output: "
                                 f"{int(poisoned.sum())} wrong elements are NaN, fewer when all their guard regions "
                                 "hold zeros, not when one does)")
                for n in blamed:
                    side = ("past the end of" if cleared(rerun({n: ("after",)})) else
                            "before the start of" if cleared(rerun({n: ("before",)})) else "outside")
                    lines.append(f"read {side} {n} (its NaN guard reached the output: {int(poisoned.sum())} wrong "
                                 f"elements are NaN, {cleared(rerun({n: both}))} of them not when {n}'s guard "
                                 "region holds zeros)")
        changed = [n for n in ints if (o := rerun({n: both})) is not None and o.shape == out.shape
                   and bits(o) != bits(out)]
        if changed:
            again = rerun({})
            if again is not None and again.shape == out.shape and bits(again) == bits(out):
                lines += [f"read outside {n} (the wrong elements change when only the sentinel "
                          f"0x{guards.SENTINEL:02X} bytes around {n} change)" for n in changed]
        return lines

    def primitives(self, problem: Problem) -> frozenset[str]:
        """The jax primitives or torch operators the kernel calls on ``problem`` (to match failures with known
        upstream bugs, ``gmm_kernels.known_issues.matching``); empty where that cannot be told. A kernel of a
        torch convention runs once more on fresh copies of the arguments, its operators recorded
        (:func:`torch_operators`: ``aten._grouped_mm``); jax kernels say theirs where they can
        (``gmm_kernels.user.FunctionAdapter``)."""
        if self.convention_facts.framework != "torch" or missing_module("torch"):
            return frozenset()
        seen: frozenset[str] = frozenset()
        try:
            with self.arguments(problem) as (args, kwargs):
                seen = torch_operators(self.invoke, args, kwargs)
        except Exception:  # noqa: BLE001 - e.g. the kernel wrote to an input: it still called what it called
            pass
        return seen

    def differentiable_fn(self) -> Any:
        """The kernel as a function of its convention's (jax or torch) arguments that
        ``jax.vjp`` / torch autograd can differentiate, or None."""
        return None

    def vjp(self, problem: Problem, cotangent: Any) -> dict[str, np.ndarray]:
        """Reverse-mode gradients of ``run(problem)`` for ``cotangent``: ``{"lhs", "rhs"}``
        (and ``"existing_out"`` when the problem has one), stored like the inputs; compare
        with ``gmm_ref.gradients``. NotImplementedError where there is no gradient."""
        fn = self.differentiable_fn()
        if fn is None:
            raise NotImplementedError(f"{self.name}: no reverse-mode gradient in this adapter")
        module = type(self).__module__  # a built-in adapter's backward pass is jitted, its executables cached
        with self.arguments(problem) as (args, kwargs), watched_call(self.name):
            return autodiff.vjp(fn, self.convention_facts, args, kwargs, cotangent, name=self.name,
                                cached_in=module if module.startswith(_BUILTIN_ADAPTERS) else None)

    def _own(self, problem: Problem) -> Problem:
        return problem if problem.convention == self.convention else problem.replace(convention=self.convention)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.convention})>"


class VariantAdapter(KernelAdapter):
    """One of several implementations of a kernel's op, named ``op[implementation]``.

    ``xla_via`` says how the ``"xla"`` implementation reaches XLA's ragged_dot,
    whose upstream bugs it then inherits (``gmm_kernels.known_issues``).
    """

    #: the op's name (``"tokamax.ragged_dot"``)
    op: ClassVar[str] = ""
    implementations: ClassVar[tuple[str, ...]] = ()
    xla_via: ClassVar[str] = ""

    def __init__(self, implementation: str = "xla") -> None:
        if implementation not in self.implementations:
            raise ValueError(f"implementation: expected one of {self.implementations}, got {implementation!r}")
        self.implementation = implementation
        self.name = f"{self.op}[{implementation}]"  # type: ignore[misc]

    @property
    def known_issues(self) -> tuple[KnownIssue, ...]:  # type: ignore[override]
        if self.implementation != "xla" or not self.xla_via:
            return ()
        return xla_nan_leak_issues(self.xla_via)


@dataclasses.dataclass(frozen=True)
class RoutedLimits:
    """What a routed MoE kernel takes within its routed convention, as facts (a slow kernel's cheap extents):
    the most tokens ``T``, the global expert counts and ``(K, N)`` extents it is checked at, the largest
    ``top_k`` (None: the strategies' own)."""

    max_tokens: int | None = None
    num_experts: tuple[int, ...] | None = None
    extents: tuple[tuple[int, int], ...] | None = None
    max_top_k: int | None = None


class RoutedKernelAdapter(KernelAdapter):
    """An adapter of a routed MoE kernel (docs/routed.md): its convention is a
    :class:`gmm_ref.conventions.base.RoutedConvention`, it runs on a :class:`gmm_ref.Routing` and returns its
    convention's ``output``: per slot ``[T, top_k, N]`` or combined ``[T, N]``, held to
    :func:`gmm_ref.routed_reference` within the bound of its :meth:`numerics_for` (a
    :class:`gmm_ref.RoutedNumerics`); a backward kernel (its convention's ``backward``) runs on a
    :class:`gmm_ref.RoutedBackward` and returns a gradient, held to :func:`gmm_ref.routed_gradients`. Its row in
    the main job is its convention's ``family`` (``routed``)."""

    #: a routed kernel (``property_tests.checks.check`` draws routings for it, not grouped problems)
    routed: ClassVar[bool] = True

    @property
    def families(self) -> tuple[str, ...]:
        return (self.convention_facts.family,)

    def supports(self, routing: Any) -> str | None:  # type: ignore[override]
        """None when the kernel can take ``routing``, else the reason it cannot (a grouped problem: it takes none)."""
        from gmm_ref import Routing

        if not isinstance(routing, Routing):
            return f"{self.name} is a routed MoE kernel: it takes a gmm_ref.Routing, not a {type(routing).__name__}"
        return (self.convention_facts.refusal(routing)
                or self.dtype_refusal(routing.tokens.dtype, routing.experts.dtype, routing.out_dtype)
                or self._refusal(routing))

    def routed_limits(self) -> RoutedLimits:
        """What the kernel takes within its convention (:class:`RoutedLimits`; none of its own by default)."""
        return RoutedLimits()

    def large_refusal(self) -> str | None:
        """A Triton kernel off CUDA runs in Triton's interpreter (:meth:`interpreted`: few examples a mode in the
        default run, ``property_tests.checks.tiers.examples_in_default_run``; or it is unavailable, the interpreter
        off), whether or not ``available()`` has set ``TRITON_INTERPRET`` yet."""
        if "triton" in self.requires and not device.on_cuda():
            return self._runs_interpreted("Triton's interpreter", takes="days")
        return None

    def limits(self) -> Limits:
        return Limits()

    def numerics_for(self, routing: Any) -> Any:  # type: ignore[override]
        """The kernel's :class:`gmm_ref.RoutedNumerics` for ``routing`` (the product's default numerics, the
        weight multiplied into the accumulator, subnormals flushed where :attr:`flush_subnormals`). A Triton
        kernel's float32 products go through ``tl.dot``'s default TF32 inputs, on a GPU as in the harness's
        interpreter (declared as bfloat16 products, a sound, slightly looser bound)."""
        from gmm_ref import RoutedNumerics

        product = Numerics.default_for(routing.tokens.dtype, routing.experts.dtype, routing.out_dtype)
        product = dataclasses.replace(product, flush_subnormals=self.flush_subnormals)
        if "triton" in self.requires and str(routing.tokens.dtype) == "float32":
            product = dataclasses.replace(product, multiply="bfloat16")
        return RoutedNumerics(product=product)

    def reference_for(self, routing: Any) -> Any:  # type: ignore[override]
        """The routed reference of ``routing``; for a backward kernel its gradients (``routing`` a
        :class:`gmm_ref.RoutedBackward`)."""
        from gmm_ref import routed_gradients, routed_reference

        return routed_gradients(routing) if self.convention_facts.backward else routed_reference(routing)

    def run(self, routing: Any) -> np.ndarray:  # type: ignore[override]
        """Run the kernel on fresh copies of its convention's arguments for ``routing``; its output (per slot or
        combined) as NumPy. ``gmm_ref.Mismatch`` if the kernel wrote to an input."""
        conv = self.convention_facts
        pristine = conv.arguments(routing)
        with guarded_arguments(self.name, conv, pristine, lambda: _observed(self, routing)) as given:
            out = self.invoke(*given[0], **given[1])
            if conv.framework == "torch":
                device.synchronize()
            if out is None and conv.out_argument is not None:  # a host array: the device's copied back on exit
                out = conv.out_value(*given)
        return conv.per_slot(as_numpy(out, name=f"output of {self.name}", strict=True), *pristine)
