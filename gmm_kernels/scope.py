"""What a kernel declares it supports, so that the harness checks exactly that, all of it.

A :class:`Scope` narrows a kernel's convention: the families (torch's forms),
input and output dtypes, a multiple per axis (K % 32 for an MX kernel), whether
rows past the last group may exist, its numerics, and the upstream bugs it is
known to carry (:class:`KnownIssue`, with the package versions they are known
on). The same declaration comes from Python (``Scope(...)``, or the
:func:`declare` decorator on a kernel function), from the main job's options
(``--families --dtypes --multiple k=32 --no-tail --numerics ...``) and from the
plugin's (``--gmm-families`` ...). A declaration that leaves nothing to check
is a ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import numpy as np

from gmm_ref import FAMILIES, Numerics, Problem
from gmm_ref.conventions import Convention
from gmm_ref.conventions.base import has_tail
from gmm_ref.dtypes import as_dtype
from gmm_ref.quantizers import quantizer_from_json, quantizer_to_json

__all__ = ["KnownIssue", "Scope", "declare", "parse_multiples", "parse_numerics", "parse_quantizes"]

_AXES = ("m", "k", "n")


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

    def __post_init__(self) -> None:
        set_ = object.__setattr__
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
        multiples = dict(self.multiples)
        for axis, value in multiples.items():
            if axis not in _AXES or isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"multiples: expected {{axis: positive int}} with axes {_AXES}, got {dict(multiples)}")
        set_(self, "multiples", multiples)
        if self.zero_extents is not None:
            axes = (self.zero_extents,) if isinstance(self.zero_extents, str) else tuple(self.zero_extents)
            if any(a not in _AXES for a in axes):
                raise ValueError(f"zero_extents: expected some of the axes {_AXES}, got {self.zero_extents!r}")
            set_(self, "zero_extents", tuple(a for a in _AXES if a in axes))
        if not isinstance(self.tail, bool):
            raise TypeError(f"tail: expected a bool, got {self.tail!r}")
        if self.numerics is not None and not isinstance(self.numerics, Numerics):
            raise TypeError(f"numerics: expected a gmm_ref.Numerics, got {type(self.numerics).__name__}")
        if not all(isinstance(k, KnownIssue) for k in self.known_issues):
            raise TypeError("known_issues: expected KnownIssue entries")

    def bind(self, convention: Convention) -> Scope:
        """Check the scope against ``convention``; ValueError if it leaves nothing to check."""
        fams = self.families_in(convention)
        if not fams:
            raise ValueError(f"families: {self.families} leaves none of {convention.name}'s {convention.families}")
        if not self.dtype_pairs(convention):
            raise ValueError(f"dtypes: {self.dtypes} / out_dtypes: {self.out_dtypes} leave none of "
                             f"{convention.name}'s input/output dtypes "
                             f"{[tuple(map(str, p)) for p in convention.dtype_pairs]}")
        return self

    def families_in(self, convention: Convention) -> tuple[str, ...]:
        return tuple(f for f in convention.families if self.families is None or f in self.families)

    def takes(self, in_dtype: Any, out_dtype: Any) -> bool:
        """Whether the scope takes inputs of ``in_dtype`` giving ``out_dtype``."""
        i, o = str(in_dtype), str(out_dtype)
        return ((self.dtypes is None or any(e in (i, f"{i}->{o}") for e in self.dtypes))
                and (self.out_dtypes is None or o in self.out_dtypes))

    def dtype_pairs(self, convention: Convention) -> tuple[tuple[np.dtype, np.dtype], ...]:
        return tuple((i, o) for i, o in convention.dtype_pairs if self.takes(i, o))

    def refusal(self, p: Problem) -> str | None:
        """Why ``p`` is outside the declared scope, else None."""
        if self.families is not None and p.family not in self.families:
            return f"the declared scope has the families {self.families}, not {p.family!r}"
        if not (p.lhs.dtype == p.rhs.dtype and self.takes(p.lhs.dtype, p.out_dtype)):
            have = f"{p.lhs.dtype} x {p.rhs.dtype} -> {p.out_dtype}"
            return f"the declared scope takes dtypes {self.dtypes} / out_dtypes {self.out_dtypes}, not {have}"
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
        return None

    def strategy_options(self, convention: Convention) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if self.dtypes is not None or self.out_dtypes is not None:
            opts["dtypes"] = self.dtype_pairs(convention)
        if self.multiples:
            opts["multiple_of"] = dict(self.multiples)
        if not self.tail:
            opts["allow_tail"] = False
        if self.zero_extents is not None:
            opts["zero_extents"] = self.zero_extents
        return opts

    def to_json(self) -> dict[str, Any]:
        """The declaration as JSON (its known issues stay with the kernel that declares them)."""
        n = self.numerics
        return {"families": self.families, "dtypes": self.dtypes, "out_dtypes": self.out_dtypes,
                "multiples": dict(self.multiples), "tail": self.tail,
                "zero_extents": None if self.zero_extents is None else list(self.zero_extents),
                "numerics": None if n is None else n.to_json(),
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
                   zero_extents=d.get("zero_extents"), quantizes=quantizes)

    def describe(self) -> str:
        parts = [f"families {','.join(self.families)}" if self.families else "",
                 f"dtypes {','.join(self.dtypes)}" if self.dtypes else "",
                 f"out_dtypes {','.join(self.out_dtypes)}" if self.out_dtypes else "",
                 " ".join(f"{a}%{v}" for a, v in self.multiples.items()),
                 "" if self.tail else "no tail",
                 "" if self.zero_extents is None else
                 f"zero extents {','.join(self.zero_extents) or 'none'}",
                 f"numerics {self.numerics}" if self.numerics else "",
                 "" if self.quantizes is None else "quantizes " + " x ".join(
                     "-" if q is None else q.describe() for q in self.quantizes),
                 f"{len(self.known_issues)} known issue(s)" if self.known_issues else ""]
        return "; ".join(p for p in parts if p) or "the whole convention"


def declare(convention: str, **scope: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a kernel function with its convention and :class:`Scope`; ``check_kernel``, the plugin and
    ``--kernel pkg.module:fn`` then check exactly that scope."""
    declared = Scope(**scope)

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.__gmm_convention__ = convention  # type: ignore[attr-defined]
        fn.__gmm_scope__ = declared  # type: ignore[attr-defined]
        return fn

    return mark


def parse_multiples(items: list[str] | None, *, option: str = "--multiple") -> dict[str, int]:
    """``["k=32", "n=16"]`` -> ``{"k": 32, "n": 16}``; ValueError naming ``option``."""
    out: dict[str, int] = {}
    for item in items or []:
        axis, _, value = item.partition("=")
        try:
            number = int(value)
        except ValueError:
            number = 0
        if axis not in _AXES or number < 1:
            raise ValueError(f"{option}: expected AXIS=N with AXIS one of {_AXES} and N a positive int, got {item!r}")
        out[axis] = math.lcm(out.get(axis, 1), number)
    return out


def parse_numerics(text: str | None, *, option: str = "--numerics") -> Numerics | None:
    """``"accumulate=float32,multiply=bfloat16,flush"`` -> ``Numerics``; ValueError naming ``option``."""
    if text is None:
        return None
    fields: dict[str, Any] = {"multiply": None, "accumulate": "float32", "flush_subnormals": False}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        key, eq, value = item.partition("=")
        if key in ("flush", "flush_subnormals") and (not eq or value in ("true", "1", "yes")):
            fields["flush_subnormals"] = True
        elif key in ("flush", "flush_subnormals") and value in ("false", "0", "no"):
            fields["flush_subnormals"] = False
        elif key in ("multiply", "accumulate") and eq:
            fields[key] = None if value in ("exact", "none") else value
        elif key == "promote_every" and eq and value.isdigit():
            fields[key] = int(value)
        elif key == "partial" and eq:
            fields["partial_accumulate"] = _roundoff(value)
        else:
            raise ValueError(f"{option}: expected accumulate=DTYPE, multiply=DTYPE|exact, flush[=true|false], "
                             f"promote_every=N and partial=DTYPE|2**-BITS separated by commas, got {item!r}")
    try:
        return Numerics(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{option}: {exc}") from None


def _roundoff(value: str) -> Any:
    """``partial=``'s value: ``2**-13`` (a unit roundoff), a float, or a dtype name."""
    text = value.replace("^", "**")
    if text.startswith("2**"):
        try:
            return 2.0 ** int(text[3:])
        except ValueError:
            return value
    try:
        return float(text)
    except ValueError:
        return value



def parse_quantizes(text: str | None, *, option: str = "--quantizes") -> tuple[Any, Any] | None:
    """``"mx:float8_e4m3fn:32:rceil"`` (both operands) or ``"lhs=mx:...,rhs=mx:..."`` -> ``(lhs, rhs)``
    ``gmm_ref.MXQuantizer`` (None for an operand not named); each part after ``mx`` is optional (defaults:
    float8_e4m3fn, 32, rceil). ValueError naming ``option``."""
    if text is None:
        return None
    from gmm_ref import MXQuantizer

    def one(spec: str) -> Any:
        kind, *parts = spec.split(":")
        if kind != "mx" or len(parts) > 3:
            raise ValueError(f"{option}: expected mx[:ELEM[:BLOCK[:MODE]]] (e.g. mx:float8_e4m3fn:32:rceil), "
                             f"got {spec!r}")
        elem, block, mode = (parts + [None] * 3)[:3]
        try:
            return MXQuantizer(elem or "float8_e4m3fn", int(block) if block else 32, mode or "rceil")
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{option}: {exc}") from None

    items = [t.strip() for t in text.split(",") if t.strip()]
    if len(items) == 1 and "=" not in items[0]:
        q = one(items[0])
        return (q, q)
    out: dict[str, Any] = {}
    for item in items:
        side, eq, spec = item.partition("=")
        if side not in ("lhs", "rhs") or not eq or side in out:
            raise ValueError(f"{option}: expected SPEC for both operands or lhs=SPEC and/or rhs=SPEC, got {text!r}")
        out[side] = one(spec)
    if not out:
        raise ValueError(f"{option}: expected a quantizer, got {text!r}")
    return (out.get("lhs"), out.get("rhs"))
