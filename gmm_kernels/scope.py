"""What a kernel declares it supports, so that the harness checks exactly that, all of it.

A :class:`Scope` narrows a kernel's convention: the families (torch's forms),
input and output dtypes, a multiple per axis (K % 32 for an MX kernel), whether
rows past the last group may exist, how its operands may lie in memory (their
layouts, storages and byte alignment), its numerics, and the upstream bugs it is
known to carry (:class:`KnownIssue`, with the package versions they are known
on). The same declaration comes from Python (``Scope(...)``, or the
:func:`declare` decorator on a kernel function), from the main job's options
(``--families --dtypes --multiple k=32 --no-tail --layouts plain --alignment 16 --numerics ...``) and from the
plugin's (``--gmm-families`` ...), which ``property_tests.cli.options`` turns into
these fields. A declaration that leaves nothing to check is a ``ValueError``.

:class:`Limits` holds what a kernel takes as facts (its dtype pairs, families,
multiples, group counts, the features it refuses): the adapter's own, narrowed
by its scope. How the harness draws problems within them is the harness's
(``property_tests.checks.declared``); nothing here knows its strategies' keywords.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib import metadata
from typing import Any

import numpy as np

from gmm_ref import FAMILIES, Numerics, Problem
from gmm_ref.conventions import Convention
from gmm_ref.conventions.base import has_tail
from gmm_ref.dtypes import as_dtype
from gmm_ref.layouts import LAYOUT_NAMES, layout_name, misalignment, named, stored_geometry
from gmm_ref.problem import STORAGES
from gmm_ref.scaled.quantizers import quantizer_from_json, quantizer_to_json

__all__ = ["FEATURES", "KnownIssue", "Limits", "Scope", "declare"]

_AXES = ("m", "k", "n")
_OPERANDS = ("lhs", "rhs")
#: the problem features a kernel may take none of (:attr:`Limits.refuses`): sharded groups (``group_offset``,
#: ``num_local_groups``) and an existing output
FEATURES = ("sharding", "existing_out")


@dataclass(frozen=True)
class KnownIssue:
    """An upstream bug a kernel is known to carry in ``modes``, on the package ``versions`` given
    (a PEP 440 specifier per distribution, e.g. ``{"jax": "<=0.10.2"}``) and, for a bug that shows only on
    some machines (a processor's instruction set, say), where its ``condition`` (a function of no argument,
    called when the issue is asked about; cache it) says it shows; outside them it is not assumed, so a fixed
    bug, or a machine without it, shows as a pass rather than a failing strict xfail."""

    modes: tuple[str, ...]
    text: str
    versions: Mapping[str, str] = field(default_factory=dict)
    #: the jax primitive (``ragged_dot_general``) or torch operator (``aten._grouped_mm``) the bug lives in, and
    #: the mismatch kind it shows as: a failure of a kernel that calls it, of this kind, in one of ``modes``,
    #: cites the bug (``gmm_kernels.known_issues.matching``)
    primitive: str = ""
    kind: str = ""
    #: None: wherever ``versions`` hold; else whether the bug shows on this machine (e.g. a probe that runs
    #: its reproducer once per process)
    condition: Callable[[], bool] | None = None

    def __post_init__(self) -> None:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        modes = (self.modes,) if isinstance(self.modes, str) else tuple(self.modes)
        if not modes or not all(isinstance(m, str) and m for m in modes):
            raise ValueError(f"modes: expected one or more mode names, got {self.modes!r}")
        object.__setattr__(self, "modes", modes)
        if not isinstance(self.text, str) or not self.text:
            raise TypeError(f"text: expected the bug's description, got {self.text!r}")
        if not isinstance(self.versions, Mapping):
            raise TypeError(f"versions: expected {{distribution: PEP 440 specifier}}, got {self.versions!r}")
        for dist, spec in self.versions.items():
            try:
                SpecifierSet(spec)
            except (InvalidSpecifier, TypeError):
                raise ValueError(f"versions: expected {{distribution: PEP 440 specifier}}, got {dist!r}: {spec!r}")\
                    from None
        object.__setattr__(self, "versions", dict(self.versions))
        if self.condition is not None and not callable(self.condition):
            raise TypeError(f"condition: expected a function of no argument returning a bool, got {self.condition!r}")

    def applies(self) -> bool:
        """Whether every package it names is installed at a version it is known on, and its ``condition``
        (if any) says the bug shows on this machine."""
        from packaging.specifiers import SpecifierSet

        for dist, spec in self.versions.items():
            try:
                installed = metadata.version(dist)
            except metadata.PackageNotFoundError:
                return False
            if installed not in SpecifierSet(spec):
                return False
        return self.condition is None or bool(self.condition())

    def describe(self) -> str:
        known = ", ".join(f"{d} {s}" for d, s in self.versions.items())
        return self.text + (f" (known on {known})" if known else "")


def _dtype_entry(value: Any) -> str:
    """A dtypes entry: an input dtype (any output), or an (input, output) pair written ``"in->out"``."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        i, o = value
    elif isinstance(value, str) and "->" in value:
        i, o = value.split("->", 1)
    else:
        return str(as_dtype(value, name="dtypes"))
    return f"{as_dtype(str(i).strip(), name='dtypes')}->{as_dtype(str(o).strip(), name='dtypes')}"


def _names(name: str, values: Any, allowed: tuple[str, ...] | None = None) -> tuple[str, ...] | None:
    if values is None:
        return None
    values = (values,) if isinstance(values, str) else tuple(values)
    if not values:
        raise ValueError(f"{name}: expected at least one value, got none")
    if allowed is not None:
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ValueError(f"{name}: expected some of {allowed}, got {bad}")
    return values


def _multiples(value: Mapping[str, int]) -> dict[str, int]:
    multiples = dict(value)
    for axis, mult in multiples.items():
        if axis not in _AXES or isinstance(mult, bool) or not isinstance(mult, int) or mult < 1:
            raise ValueError(f"multiples: expected {{axis: positive int}} with axes {_AXES}, got {multiples}")
    return multiples


def _some(name: str, value: Any, allowed: tuple[str, ...], what: str, empty: bool = True) -> tuple[str, ...]:
    """Some of ``allowed``, in its order; ``"none"`` (as the command line spells it) and an empty list are ``()``
    (where ``empty`` allows none), ``"a,b"`` is ``("a", "b")``."""
    given = value
    if isinstance(value, str):
        value = () if value.strip() == "none" else tuple(a.strip() for a in value.split(",") if a.strip())
    got = tuple(value)
    if any(a not in allowed for a in got) or not (got or empty):
        raise ValueError(f"{name}: expected {'some' if empty else 'one or more'} of the {what} {allowed}"
                         f"{', none or an empty list' if empty else ''}, got {given!r}")
    return tuple(a for a in allowed if a in got)


def _operands(name: str, value: Any) -> tuple[str, ...]:
    """Some of the operands ("lhs", "rhs"); None is ``()`` too."""
    return () if value is None else _some(name, value, _OPERANDS, "operands")


def _alignment(value: Any) -> dict[str, int]:
    """operand -> bytes, from an int or ``"16"`` (every operand), a mapping or ``"lhs=16,rhs=32"``; None, ``"none"``
    and ``{}`` are no alignment, and so is 1."""
    given = value
    if isinstance(value, str):
        text = value.strip()
        value = {} if text == "none" else dict(i.partition("=")[::2] for i in text.split(",")) if "=" in text else text
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        value = dict.fromkeys(_OPERANDS, value)
    out = {str(o).strip(): _power_of_two(n) for o, n in value.items()}
    if any(o not in _OPERANDS or n is None for o, n in out.items()):
        raise ValueError(f"alignment: expected a power of two of bytes for every operand (16) or per operand "
                         f"({{'lhs': 16}}, 'lhs=16,rhs=32'), or none, got {given!r}")
    return {o: out[o] for o in _OPERANDS if (out.get(o) or 1) > 1}


def _power_of_two(value: Any) -> int | None:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1 and not value & (value - 1)
    return value if ok else None


def _axes(name: str, value: Any) -> tuple[str, ...] | None:
    """Some of the axes ("m", "k", "n"); None stays None (every axis the convention takes)."""
    return None if value is None else _some(name, value, _AXES, "axes")


@dataclass(frozen=True)
class Scope:
    """What a kernel supports (None: whatever its convention takes)."""

    families: tuple[str, ...] | None = None
    dtypes: tuple[str, ...] | None = None
    out_dtypes: tuple[str, ...] | None = None
    multiples: Mapping[str, int] = field(default_factory=dict)
    tail: bool = True
    numerics: Numerics | None = None
    known_issues: tuple[KnownIssue, ...] = ()
    #: the axes ("m", "k", "n") whose extent may be 0 (None: every one the convention takes)
    zero_extents: tuple[str, ...] | None = None
    #: ``(lhs, rhs)`` ``gmm_ref.MXQuantizer`` (or None) of a kernel that quantizes its inputs itself: it is held
    #: to the reference of its inputs quantized so (``gmm_ref.quantize_problem``)
    quantizes: tuple[Any, Any] | None = None
    #: the operands ("lhs", "rhs") the kernel takes only contiguous (a convention whose arguments carry strides:
    #: no transposed view, slice or chunk of a larger tensor)
    contiguous: tuple[str, ...] = ()
    #: the operands it takes only with a last stride of 1 (no transposed view; a slice or a chunk is fine)
    unit_stride: tuple[str, ...] = ()
    #: the layouts it takes (``gmm_ref.layouts.LAYOUT_NAMES``: ``plain``, ``lhsT``, ``rhsT``, ``lhsT+rhsT``,
    #: ``packed``, ...), of those its convention hands it (None: every one)
    layouts: tuple[str, ...] | None = None
    #: operand -> the bytes (a power of two) that its offset into its buffer and every stride but its unit one
    #: must be multiples of (torch._grouped_mm's rule is 16); an int is every operand's
    alignment: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "contiguous", _operands("contiguous", self.contiguous))
        set_(self, "unit_stride", _operands("unit_stride", self.unit_stride))
        if self.layouts is not None:
            set_(self, "layouts", _some("layouts", self.layouts, LAYOUT_NAMES, "layouts", empty=False))
        set_(self, "alignment", _alignment(self.alignment))
        if self.quantizes is not None:
            from gmm_ref import AmaxQuantizer, MXQuantizer

            q = self.quantizes
            if (not isinstance(q, tuple) or len(q) != 2 or all(x is None for x in q)
                    or not all(x is None or isinstance(x, (MXQuantizer, AmaxQuantizer)) for x in q)):
                raise TypeError(f"quantizes: expected (lhs, rhs) gmm_ref.MXQuantizer / gmm_ref.AmaxQuantizer or None, "
                                f"not both None, got {q!r}")
        set_(self, "families", _names("families", self.families, FAMILIES))
        dtypes = _names("dtypes", self.dtypes)
        set_(self, "dtypes", None if dtypes is None else tuple(_dtype_entry(v) for v in dtypes))
        outs = _names("out_dtypes", self.out_dtypes)
        set_(self, "out_dtypes", None if outs is None else tuple(str(as_dtype(v, name="out_dtypes")) for v in outs))
        set_(self, "multiples", _multiples(self.multiples))
        set_(self, "zero_extents", _axes("zero_extents", self.zero_extents))
        if not isinstance(self.tail, bool):
            raise TypeError(f"tail: expected a bool, got {self.tail!r}")
        if self.numerics is not None and not isinstance(self.numerics, Numerics):
            raise TypeError(f"numerics: expected a gmm_ref.Numerics, got {type(self.numerics).__name__}")
        if not all(isinstance(k, KnownIssue) for k in self.known_issues):
            raise TypeError("known_issues: expected KnownIssue entries")

    def bind(self, convention: Convention) -> Scope:
        """Check the scope against ``convention``; ValueError if it leaves nothing to check."""
        if self.layouts is not None and not any(self.layouts_in(convention, f) for f in convention.families
                                                if self.families is None or f in self.families):
            have = {layout_name(x) for f in convention.families for x in convention.layouts_of(f)}
            raise ValueError(f"layouts: {self.layouts} leaves none of {convention.name}'s layouts "
                             f"{tuple(n for n in LAYOUT_NAMES if n in have)}")
        fams = self.families_in(convention)
        if not fams:
            raise ValueError(f"families: {self.families} leaves none of {convention.name}'s {convention.families}")
        self.require_dtypes(convention)
        return self

    def require_dtypes(self, convention: Any) -> None:
        """ValueError if the declared dtypes leave none of ``convention``'s (input, output) pairs (a grouped or a
        routed convention)."""
        if not self.dtype_pairs(convention):
            raise ValueError(f"dtypes: {self.dtypes} / out_dtypes: {self.out_dtypes} leave none of "
                             f"{convention.name}'s input/output dtypes "
                             f"{[tuple(map(str, p)) for p in convention.dtype_pairs]}")

    def families_in(self, convention: Convention) -> tuple[str, ...]:
        """``convention``'s families the scope takes (and some layout of, where it declares its layouts)."""
        return tuple(f for f in convention.families if (self.families is None or f in self.families)
                     and (self.layouts is None or self.layouts_in(convention, f)))

    def layouts_in(self, convention: Convention, family: str) -> tuple[tuple[bool, bool, bool], ...]:
        """``convention``'s layouts of ``family`` that the scope takes."""
        return named(convention.layouts_of(family), self.layouts)

    def takes(self, in_dtype: Any, out_dtype: Any) -> bool:
        """Whether the scope takes inputs of ``in_dtype`` giving ``out_dtype``."""
        i, o = str(in_dtype), str(out_dtype)
        return ((self.dtypes is None or any(e in (i, f"{i}->{o}") for e in self.dtypes))
                and (self.out_dtypes is None or o in self.out_dtypes))

    def dtype_pairs(self, convention: Convention) -> tuple[tuple[np.dtype, np.dtype], ...]:
        return tuple((i, o) for i, o in convention.dtype_pairs if self.takes(i, o))

    def dtype_refusal(self, lhs: Any, rhs: Any, out: Any) -> str | None:
        """Why inputs of ``lhs`` x ``rhs`` giving ``out`` are outside the declared dtypes, else None."""
        lhs, rhs, out = np.dtype(lhs), np.dtype(rhs), np.dtype(out)
        if lhs == rhs and self.takes(lhs, out):
            return None
        return (f"the declared scope takes dtypes {self.dtypes} / out_dtypes {self.out_dtypes}, not {lhs} x {rhs} "
                f"-> {out}")

    def refusal(self, p: Problem) -> str | None:
        """Why ``p`` is outside the declared scope, else None."""
        if self.families is not None and p.family not in self.families:
            return f"the declared scope has the families {self.families}, not {p.family!r}"
        refused = self.dtype_refusal(p.lhs.dtype, p.rhs.dtype, p.out_dtype)
        if refused:
            return refused
        for axis, mult in self.multiples.items():
            extent = getattr(p, axis)
            if extent % mult:
                return f"the declared scope needs {axis.upper()} to be a multiple of {mult}, got {extent}"
        if not self.tail and has_tail(p):
            return "the declared scope has no rows past the last group (no tail)"
        if self.zero_extents is not None:
            for axis in _AXES:
                if getattr(p, axis) == 0 and axis not in self.zero_extents:
                    return f"the declared scope takes no {axis.upper()} = 0"
        layout = layout_name((p.lhs_transposed, p.rhs_transposed, p.packed))
        if self.layouts is not None and layout not in self.layouts:
            return f"the declared scope takes the layouts {', '.join(self.layouts)}, not {layout}"
        for operand, kind in zip(_OPERANDS, p.storage, strict=True):
            if kind != "contiguous" and operand in self.contiguous:
                return f"the declared scope takes {operand} contiguous only, not as a {kind} view"
            if kind == "transposed" and operand in self.unit_stride:
                return f"the declared scope takes {operand} with a last stride of 1 only, not as a transposed view"
        return self.alignment_refusal(p)

    def alignment_refusal(self, p: Problem) -> str | None:
        """Why an operand of ``p``, as its storage lays it out, is not aligned as declared, else None."""
        for operand, kind in zip(_OPERANDS, p.storage, strict=True):
            need, x = self.alignment.get(operand), p.lhs if operand == "lhs" else p.rhs
            item = x.dtype.itemsize
            bad = need and misalignment(x.shape, *stored_geometry(x.shape, item, kind), item, need)
            if bad:
                return (f"the declared scope takes {operand} aligned to {need} bytes (its offset and every stride but "
                        f"its unit one), not {operand} {list(x.shape)}:{x.dtype} stored {kind}, with {bad}")
        return None

    def storages(self) -> dict[str, tuple[str, ...]]:
        """The storages (``gmm_ref.problem.STORAGES``) of each operand the scope narrows, as
        ``property_tests.strategies.problems(storages=...)`` takes them."""
        out = {}
        for operand in _OPERANDS:
            if operand in self.contiguous:
                out[operand] = ("contiguous",)
            elif operand in self.unit_stride:
                out[operand] = tuple(k for k in STORAGES if k != "transposed")
        return out

    def to_json(self) -> dict[str, Any]:
        """The declaration as JSON (its known issues stay with the kernel that declares them)."""
        n = self.numerics
        return {"families": self.families, "dtypes": self.dtypes, "out_dtypes": self.out_dtypes,
                "multiples": dict(self.multiples), "tail": self.tail,
                "zero_extents": None if self.zero_extents is None else list(self.zero_extents),
                "numerics": None if n is None else n.to_json(), "contiguous": list(self.contiguous),
                "unit_stride": list(self.unit_stride), "layouts": None if self.layouts is None else list(self.layouts),
                "alignment": dict(self.alignment),
                "quantizes": None if self.quantizes is None else [
                    None if q is None else quantizer_to_json(q) for q in self.quantizes]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Scope:
        numerics = None if d.get("numerics") is None else Numerics.from_json(d["numerics"])
        quantizes = None
        if d.get("quantizes") is not None:
            quantizes = tuple(None if q is None else quantizer_from_json(q) for q in d["quantizes"])
        return cls(families=d.get("families"), dtypes=d.get("dtypes"), out_dtypes=d.get("out_dtypes"),
                   multiples=d.get("multiples") or {}, tail=d.get("tail", True), numerics=numerics,
                   zero_extents=d.get("zero_extents"), quantizes=quantizes, contiguous=d.get("contiguous") or (),
                   unit_stride=d.get("unit_stride") or (), layouts=d.get("layouts"),
                   alignment=d.get("alignment") or {})

    def describe(self) -> str:
        parts = [f"families {','.join(self.families)}" if self.families else "",
                 f"dtypes {','.join(self.dtypes)}" if self.dtypes else "",
                 f"out_dtypes {','.join(self.out_dtypes)}" if self.out_dtypes else "",
                 " ".join(f"{a}%{v}" for a, v in self.multiples.items()),
                 "" if self.tail else "no tail",
                 "" if self.zero_extents is None else
                 f"zero extents {','.join(self.zero_extents) or 'none'}",
                 f"numerics {self.numerics}" if self.numerics else "",
                 f"contiguous {','.join(self.contiguous)}" if self.contiguous else "",
                 f"unit stride {','.join(self.unit_stride)}" if self.unit_stride else "",
                 f"layouts {','.join(self.layouts)}" if self.layouts is not None else "",
                 "alignment " + ",".join(f"{o}={n}" for o, n in self.alignment.items()) if self.alignment else "",
                 "" if self.quantizes is None else "quantizes " + " x ".join(
                     "-" if q is None else q.describe() for q in self.quantizes),
                 f"{len(self.known_issues)} known issue(s)" if self.known_issues else ""]
        return "; ".join(p for p in parts if p) or "the whole convention"


@dataclass(frozen=True)
class Limits:
    """What a kernel takes within its convention, as facts about problems (none says how they are drawn).

    An adapter states its own in ``KernelAdapter._limits()`` (a Mosaic kernel's multiples of 8 and 2 to 4 groups,
    torch's no K = 0 or N = 0, ejkernel XLA's no sharding); ``KernelAdapter.limits()`` narrows them by the
    kernel's dtype declarations and :class:`Scope`. Whatever the kernel's ``_refusal`` declines for every problem
    of a kind belongs here too: the harness draws only problems within these (``property_tests.checks.declared``)."""

    #: the (input, output) dtype pairs the kernel takes (None: all its convention's)
    dtypes: tuple[tuple[Any, Any], ...] | None = None
    #: the families it is checked in (None: all its convention's)
    families: tuple[str, ...] | None = None
    #: axis ("m", "k", "n") -> a multiple its extent must be of (on top of the convention's)
    multiples: Mapping[str, int] = field(default_factory=dict)
    #: the largest extent of any axis it takes (None: no limit of its own)
    max_extent: int | None = None
    #: the largest K it takes where more than ``max_extent`` (None: ``max_extent``): a kernel run interpreted whose
    #: ``max_extent`` bounds its grid (M and N tiles) runs its K loop inside each program, so a real layer's K costs
    #: it seconds (the ``real_k`` mode's cells)
    max_k: int | None = None
    #: the fewest and most groups it takes (None: no most of its own)
    min_groups: int = 1
    max_groups: int | None = None
    #: False: every row is in a group (no rows past the last group)
    tail: bool = True
    #: the axes whose extent may be 0 (None: every one the convention takes)
    zero_extents: tuple[str, ...] | None = None
    #: the ``(lhs, rhs)`` ``gmm_ref.Quantization`` pairs of a scaled convention it takes (None: all)
    quantizations: tuple[tuple[Any, Any], ...] | None = None
    #: the :data:`FEATURES` it takes none of (``KernelAdapter.option_refusal`` says why)
    refuses: tuple[str, ...] = ()
    #: operand -> the storages (``gmm_ref.problem.STORAGES``) it takes, where narrowed (:meth:`Scope.storages`)
    storages: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: the layouts (``gmm_ref.layouts.LAYOUT_NAMES``) it takes, where narrowed (:attr:`Scope.layouts`)
    layouts: tuple[str, ...] | None = None
    #: operand -> the bytes its offset and strides must be multiples of, where it needs any (:attr:`Scope.alignment`)
    alignment: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "multiples", _multiples(self.multiples))
        set_(self, "zero_extents", _axes("zero_extents", self.zero_extents))
        set_(self, "families", _names("families", self.families, FAMILIES))
        set_(self, "refuses", _names("refuses", self.refuses, FEATURES) if self.refuses else ())
        for name in ("max_extent", "max_k", "min_groups", "max_groups"):
            value = getattr(self, name)
            if (value is not None or name == "min_groups") and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.max_groups is not None and self.max_groups < self.min_groups:
            raise ValueError(f"max_groups: expected at least min_groups={self.min_groups}, got {self.max_groups}")
        if not isinstance(self.tail, bool):
            raise TypeError(f"tail: expected a bool, got {self.tail!r}")
        if self.layouts is not None:
            set_(self, "layouts", _some("layouts", self.layouts, LAYOUT_NAMES, "layouts", empty=False))
        set_(self, "alignment", _alignment(self.alignment))

    def narrowed(self, scope: Scope | None) -> Limits:
        """These limits and ``scope``'s (its multiples, tail, zero extents, storages, layouts and alignment)
        together: a problem within the result is within both."""
        if scope is None:
            return self
        multiples = dict(self.multiples)
        for axis, mult in scope.multiples.items():
            multiples[axis] = math.lcm(multiples.get(axis, 1), mult)
        zero = self.zero_extents if scope.zero_extents is None else tuple(
            a for a in scope.zero_extents if self.zero_extents is None or a in self.zero_extents)
        storages = dict(self.storages)
        for operand, kinds in scope.storages().items():
            storages[operand] = tuple(k for k in storages.get(operand, STORAGES) if k in kinds)
        layouts = self.layouts if scope.layouts is None else tuple(
            n for n in scope.layouts if self.layouts is None or n in self.layouts)
        alignment = {o: max(self.alignment.get(o, 1), scope.alignment.get(o, 1)) for o in _OPERANDS}  # powers of two
        return replace(self, multiples=multiples, tail=self.tail and scope.tail, zero_extents=zero, storages=storages,
                       layouts=layouts, alignment=alignment)


def declare(convention: str, **scope: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a kernel function with its convention and :class:`Scope`; ``check_kernel``, the plugin and
    ``--kernel pkg.module:fn`` then check exactly that scope. A routed convention's ``numerics`` is a
    :class:`gmm_ref.RoutedNumerics` (or the :class:`gmm_ref.Numerics` of its product), kept apart from the scope
    as ``--numerics`` and ``wrap(numerics=...)`` keep it."""
    from gmm_ref import RoutedNumerics, conventions
    from gmm_ref.conventions.base import RoutedConvention

    numerics = None
    if isinstance(conventions.get(convention), RoutedConvention) and "numerics" in scope:
        numerics = scope.pop("numerics")
        if isinstance(numerics, Numerics):
            numerics = RoutedNumerics(product=numerics)
        if not isinstance(numerics, RoutedNumerics):
            raise TypeError(f"numerics: expected a gmm_ref.RoutedNumerics (or the product's Numerics) for the routed "
                            f"convention {convention!r}, got {type(numerics).__name__}")
    declared = Scope(**scope)

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.__gmm_convention__ = convention  # type: ignore[attr-defined]
        fn.__gmm_scope__ = declared  # type: ignore[attr-defined]
        fn.__gmm_numerics__ = numerics  # type: ignore[attr-defined]
        return fn

    return mark
