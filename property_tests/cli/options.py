"""The scope options the main job and the pytest plugin share (the plugin's carry a ``--gmm-`` prefix).

``--families ragged_m --dtypes bfloat16 --out-dtypes float32 --multiple k=32 --no-tail
--zero-extents none --contiguous lhs --unit-stride rhs --layouts plain,rhsT --alignment lhs=16,rhs=16
--numerics accumulate=float32,flush --quantizes mx:float8_e4m3fn:32:rceil`` declare what a kernel supports
(``gmm_kernels.Scope``): they narrow the scope the kernel already declares
(``gmm_kernels.declare``) field by field, and one that leaves nothing to check
is a usage error naming the option. The command-line forms are parsed here
(:func:`scope_fields`, :func:`parse_multiples`, :func:`parse_quantizes`; the text
form of ``Numerics`` is ``gmm_ref.numerics.parse_numerics``, which ``python -m
golden`` takes too); ``gmm_kernels.Scope`` holds only the fields. A routed MoE
function takes ``--dtypes``, ``--out-dtypes`` and ``--numerics``, with ``weight=``
and ``combine=`` (``gmm_ref.routed.routing.parse_declared_numerics``: its
``gmm_ref.RoutedNumerics``); a built-in routed adapter none of them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from gmm_kernels import KernelAdapter, Scope, configure
from gmm_kernels.resolve import declared_scope_refusal
from gmm_ref import FAMILIES, MXQuantizer, RoutedNumerics
from gmm_ref.names import did_you_mean
from gmm_ref.numerics import parse_numerics
from gmm_ref.routed.routing import parse_declared_numerics

__all__ = ["SCOPE_OPTIONS", "add_device_option", "add_scope_options", "apply_scope", "modes_option",
           "parse_multiples", "parse_numerics", "parse_quantizes", "scope_fields", "split_list", "suggestions"]

#: the axes an extent option names
AXES = ("m", "k", "n")

#: (option name without prefix, argparse keyword arguments)
SCOPE_OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("families", dict(metavar="F,F", help="families the kernel supports (ragged_m, ragged_n, ragged_k, batch)")),
    ("dtypes", dict(metavar="D,D", help="input dtypes the kernel supports, e.g. bfloat16,float32")),
    ("out-dtypes", dict(metavar="D,D", help="output dtypes the kernel supports")),
    ("multiple", dict(action="append", metavar="AXIS=N",
                      help="an extent the kernel needs a multiple of, e.g. k=32 (repeatable)")),
    ("no-tail", dict(action="store_true", help="every row is in a group: no rows past the last group")),
    ("zero-extents", dict(metavar="AXES", help="the axes whose extent may be 0: some of m,k,n, or none")),
    ("contiguous", dict(metavar="OPS", help="the operands the kernel takes only contiguous (no view: transposed, a "
                                            "slice, a chunk): some of lhs,rhs, or none")),
    ("unit-stride", dict(metavar="OPS", help="the operands the kernel takes only with a last stride of 1 (no "
                                             "transposed view): some of lhs,rhs, or none")),
    ("layouts", dict(metavar="L,L", help="the operand layouts the kernel takes, of those its convention hands it: "
                                         "some of plain, rhsT, lhsT, lhsT+rhsT, packed, ... (docs/conventions.md)")),
    ("alignment", dict(metavar="BYTES", help="the bytes (a power of two) each operand's offset into its buffer and "
                                             "every stride but its unit one must be multiples of: N for every "
                                             "operand, or lhs=N,rhs=N")),
    ("numerics", dict(metavar="SPEC", help="the kernel's arithmetic: accumulate=DTYPE[,multiply=DTYPE][,flush]; a "
                                           "routed kernel's also [,weight=accumulator|output|DTYPE]"
                                           "[,combine=accumulator|DTYPE] (docs/routed.md)")),
    ("quantizes", dict(metavar="SPEC", help="the kernel quantizes its inputs itself: mx[:ELEM[:BLOCK[:MODE]]] for "
                                            "both operands, or lhs=...,rhs=... (docs/scaled.md)")),
)


def add_scope_options(add: Callable[..., Any], prefix: str = "--") -> None:
    """Register the scope options with ``add`` (argparse's ``add_argument`` or pytest's ``addoption``)."""
    for name, kwargs in SCOPE_OPTIONS:
        extra = {} if kwargs.get("action") else {"default": None}
        add(prefix + name, **kwargs, **extra)


def add_device_option(add: Callable[..., Any], prefix: str = "--", **extra: Any) -> None:
    """Register the device option (``--device``; the plugin's ``--gmm-device``) with ``add``; its values are
    ``gmm_kernels.sandbox.device``'s to parse and resolve."""
    add(prefix + "device", default=None, metavar="auto|cpu|cuda|cuda:N", **extra,
        help="the device torch-convention kernels run on: their operands, offsets and outputs are made there "
             "(default: auto, CUDA where torch sees a GPU, else cpu); jax kernels run on jax's default device")


def split_list(text: str | None, option: str) -> list[str] | None:
    """``"a,b"`` -> ``["a", "b"]``; ValueError naming ``option`` for an empty list."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"{option}: expected a comma-separated list, got {text!r}")
    return items


def scope_fields(values: Mapping[str, Any], prefix: str = "--") -> dict[str, Any]:
    """The Scope fields the options in ``values`` (keyed by option name without prefix) set; ValueError
    or TypeError naming the option."""
    fields: dict[str, Any] = {}
    for name, field in (("families", "families"), ("dtypes", "dtypes"), ("out-dtypes", "out_dtypes")):
        items = split_list(values.get(name), prefix + name)
        if items is not None:
            try:
                Scope(**{field: items})
            except (TypeError, ValueError) as exc:
                hint = suggestions(items, FAMILIES) if name == "families" else ""
                raise ValueError(f"{prefix}{name}: {exc}{hint}") from None
            fields[field] = items
    if values.get("multiple"):
        fields["multiples"] = parse_multiples(values["multiple"], option=prefix + "multiple")
    if values.get("no-tail"):
        fields["tail"] = False
    zero = values.get("zero-extents")
    if zero is not None:
        axes = [] if zero.strip() == "none" else split_list(zero, prefix + "zero-extents")
        if any(a not in AXES for a in axes):
            raise ValueError(f"{prefix}zero-extents: expected some of m,k,n or none, got {zero!r}")
        fields["zero_extents"] = tuple(axes)
    for name in ("contiguous", "unit-stride", "layouts", "alignment"):
        if values.get(name) is not None:
            key = name.replace("-", "_")
            try:
                fields[key] = getattr(Scope(**{key: values[name]}), key)
            except ValueError as exc:  # "unit_stride: ..." from the Scope: the option's own spelling
                raise ValueError(f"{prefix}{name}{str(exc).removeprefix(key)}") from None
    numerics = parse_declared_numerics(values.get("numerics"), option=prefix + "numerics")
    if numerics is not None:
        fields["numerics"] = numerics
    quantizes = parse_quantizes(values.get("quantizes"), option=prefix + "quantizes")
    if quantizes is not None:
        fields["quantizes"] = quantizes
    return fields


def parse_multiples(items: list[str] | None, *, option: str = "--multiple") -> dict[str, int]:
    """``["k=32", "n=16"]`` -> ``{"k": 32, "n": 16}``; ValueError naming ``option``."""
    out: dict[str, int] = {}
    for item in items or []:
        axis, _, value = item.partition("=")
        try:
            number = int(value)
        except ValueError:
            number = 0
        if axis not in AXES or number < 1:
            raise ValueError(f"{option}: expected AXIS=N with AXIS one of {AXES} and N a positive int, got {item!r}")
        out[axis] = math.lcm(out.get(axis, 1), number)
    return out


def parse_quantizes(text: str | None, *, option: str = "--quantizes") -> tuple[Any, Any] | None:
    """``"mx:float8_e4m3fn:32:rceil"`` (both operands) or ``"lhs=mx:...,rhs=mx:..."`` -> ``(lhs, rhs)``
    ``gmm_ref.MXQuantizer`` (None for an operand not named); each part after ``mx`` is optional (defaults:
    float8_e4m3fn, 32, rceil). ValueError naming ``option``."""
    if text is None:
        return None

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


def apply_scope(adapter: KernelAdapter, fields: Mapping[str, Any], prefix: str = "--") -> KernelAdapter:
    """``adapter`` with its declared scope narrowed by ``fields`` (a configured copy,
    ``gmm_kernels.resolve.configure``; ``adapter`` itself when there are none); ValueError naming the option if
    nothing is left."""
    if not fields:
        return adapter
    if adapter.routed:
        why = declared_scope_refusal(adapter, prefix + _option(next(iter(fields))))
        if why:
            raise ValueError(why)
        scoped = [f for f in fields if f not in ("dtypes", "out_dtypes", "numerics")]
        if scoped:
            raise ValueError(f"{prefix}{_option(scoped[0])}: {adapter.name} is a routed MoE kernel: it "
                             f"takes only {prefix}dtypes, {prefix}out-dtypes and {prefix}numerics (docs/routed.md)")
        dtypes = {f: v for f, v in fields.items() if f != "numerics"}
        try:
            return configure(adapter, scope=dataclasses.replace(adapter.scope or Scope(), **dtypes) if dtypes else None,
                             numerics=fields.get("numerics"))
        except ValueError as exc:
            raise ValueError(f"{prefix}{exc} (kernel {adapter.name})") from None
    if isinstance(fields.get("numerics"), RoutedNumerics):
        raise ValueError(f"{prefix}numerics: weight= and combine= are a routed MoE kernel's; {adapter.name} is a "
                         f"grouped GEMM ({adapter.convention})")
    try:
        return configure(adapter, scope=dataclasses.replace(adapter.scope or Scope(), **fields))
    except ValueError as exc:
        raise ValueError(f"{prefix}{exc} (kernel {adapter.name})") from None


def _option(field: str) -> str:
    """The option (without its prefix) that sets the Scope field ``field``."""
    return {"tail": "no-tail", "multiples": "multiple"}.get(field, field.replace("_", "-"))


def modes_option(text: str | None, known: Any, error: Callable[[str], Any], default: Any = None) -> list[str]:
    """The modes of a ``--modes M,M`` option (``default``, else all of ``known``, when not given);
    ``error`` (a parser's) on a bad value."""
    try:
        modes = split_list(text, "--modes") or list(known if default is None else default)
    except ValueError as exc:
        error(str(exc))
        raise
    unknown = [m for m in modes if m not in known]
    if unknown:
        error(f"--modes: expected some of {', '.join(known)}, got {unknown}{suggestions(unknown, known)}")
    return modes


def suggestions(given: list[str], known: Any) -> str:
    """``"; did you mean X?"`` for the items of a list option that are not ``known`` (each named when several)."""
    unknown = [g for g in given if g not in known]
    hints = [(u, did_you_mean(u, known)) for u in unknown]
    if len(unknown) == 1:
        return hints[0][1]
    return "".join(f"; {u!r}:{hint.removeprefix(';')}" for u, hint in hints if hint)
