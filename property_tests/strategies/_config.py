"""Validate the arguments of ``problems()`` against the convention's facts, into a hashable :class:`Config`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from hypothesis.errors import InvalidArgument

from gmm_ref import FAMILIES, conventions
from gmm_ref import dtypes as _dt
from gmm_ref import families as family_records
from gmm_ref.conventions import Convention
from gmm_ref.conventions.base import TRANSPOSES, packed_layouts
from gmm_ref.layouts import LAYOUT_NAMES, named
from gmm_ref.problem import RAGGED_FAMILIES, STORAGES
from property_tests.strategies._common import (
    MAX_EXTENT,
    MAX_GROUPS,
    SMALL_TILE,
    check_bool,
    check_int,
    check_tiling,
    resolve,
)
from property_tests.strategies._static import Config

__all__ = ["ANY", "config", "rules_of"]

#: the facts strategies draw from without a convention: every family, layout (transposed,
#: packed), batch dims, float64, sharding and existing output (policies are drawn too); the serving
#: families take no batch dims, no sharding and keep an existing output where no group writes
ANY = Convention(
    name="any", framework="jax", families=FAMILIES,
    layouts=(*((f, tuple(dict.fromkeys(TRANSPOSES + tuple(x for x in packed_layouts(f) if x[2]))))
               for f in RAGGED_FAMILIES),
             ("masked", TRANSPOSES), ("padded_contiguous", ((False, False, False), (False, True, False)))),
    # the serving layouts when asked for by name (families=...)
    default_families=RAGGED_FAMILIES,
    dtype_pairs=(("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16"),
                 ("float16", "float16"), ("float64", "float64"), ("int8", "int32")),
    existing_policy="overwrite", sharding=True, max_batch_dims=1,
)


def rules_of(convention: str | None) -> Convention:
    """The facts a strategy draws from: the convention's, or :data:`ANY` for None."""
    if convention is None:
        return ANY
    try:
        return conventions.get(convention)
    except ValueError:
        raise InvalidArgument(
            f"convention={convention!r}, but it must be None or one of {conventions.names()}") from None


def _dtype_pairs(value: Any, rules: Convention, convention: str | None, vary_out_dtype: Any) -> tuple:
    if value is None:
        pairs = list(rules.dtype_pairs)
    else:
        if isinstance(value, (str, np.dtype, type)) or not isinstance(value, Sequence):
            value = [value]
        pairs = []
        for item in value:
            try:
                if isinstance(item, tuple):
                    i, o = _dt.as_dtype(item[0], codes=True), _dt.as_dtype(item[1])
                else:
                    i = _dt.as_dtype(item, codes=True)
                    o = np.dtype(np.int32) if _dt.is_integer(i) else i
            except (TypeError, ValueError) as exc:
                raise InvalidArgument(f"dtypes={value!r}, but {item!r} is not a dtype gmm_ref knows: {exc}") from None
            pairs.append((i, o))
        _check_pairs(value, pairs, rules, convention)
    if vary_out_dtype is not None:
        chosen = [pr for pr in pairs if (pr[0] != pr[1]) == bool(vary_out_dtype)]
        if not chosen:
            raise InvalidArgument(
                f"vary_out_dtype={vary_out_dtype!r}, but no dtype pair of {[tuple(map(str, p)) for p in pairs]} "
                "has " + ("an output dtype other than its input" if vary_out_dtype else "out_dtype == input")
            )
        pairs = chosen
    return tuple(dict.fromkeys(pairs))


def _check_pairs(value: Any, pairs: list, rules: Convention, convention: str | None) -> None:
    allowed_in = {i for i, _ in rules.dtype_pairs}
    for i, o in pairs:
        if convention is not None and i not in allowed_in:
            raise InvalidArgument(
                f"dtypes={value!r}, but convention={convention!r} takes inputs of "
                f"{sorted(str(d) for d in allowed_in)} only"
            )
        if rules.listed_pairs_only and (i, o) not in rules.dtype_pairs:
            raise InvalidArgument(f"dtypes={value!r}, but {convention} takes the (input, output) pairs "
                                  f"{[(str(a), str(b)) for a, b in rules.dtype_pairs]} only")
        if rules.out_dtype_is_input and o != i:
            raise InvalidArgument(f"dtypes={value!r}, but {convention} needs out_dtype equal to the input dtype")
        if i in rules.code_dtypes:  # codes with scales: any output the convention lists
            continue
        if _dt.is_integer(i) != _dt.is_integer(o) or i not in _dt.INPUT_DTYPES or o not in _dt.OUTPUT_DTYPES:
            raise InvalidArgument(f"dtypes={value!r}, but ({i}, {o}) is not an input/output pair gmm_ref takes")


def _families(families: Any, rules: Convention, convention: str | None) -> tuple[str, ...]:
    if families is None:
        return rules.default_families or rules.families
    fams = (families,) if isinstance(families, str) else tuple(families)
    if not fams:
        raise InvalidArgument("families=(), but at least one family is needed")
    for f in fams:
        if f not in rules.families:
            raise InvalidArgument(
                f"families={families!r}, but convention={convention!r} expresses only {rules.families}")
    return tuple(dict.fromkeys(fams))


def _sharding(sh: bool | None, rules: Convention, convention: str | None, hi: int, fams: tuple[str, ...]) -> None:
    if sh and not rules.sharding:
        raise InvalidArgument(f"sharding=True, but convention={convention!r} has no group_offset (no sharded groups)")
    if sh and hi < 2:
        raise InvalidArgument(f"sharding=True, but max_groups={hi} leaves nothing to shard (needs >= 2)")
    if sh and fams and not any(family_records.get(f).takes_sizes for f in fams):
        raise InvalidArgument(f"sharding=True, but families={fams!r} has no sharding")


def _multiples(value: Any) -> tuple[tuple[str, int], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"multiple_of={value!r}, but it must be a mapping of axes ('m', 'k', 'n') to ints")
    for axis, mult in value.items():
        if axis not in ("m", "k", "n"):
            raise InvalidArgument(f"multiple_of={dict(value)!r}, but {axis!r} is not an axis ('m', 'k', 'n')")
        check_int(f"multiple_of[{axis!r}]", mult, minimum=1, maximum=MAX_EXTENT)
    return tuple(sorted((str(a), int(m)) for a, m in value.items()))


def _zero_extents(value: Any, rules: Convention) -> tuple[str, ...]:
    if value is None:
        return tuple(rules.zero_extents)
    axes = (value,) if isinstance(value, str) else value
    if not isinstance(axes, (tuple, list)) or any(a not in ("m", "k", "n") for a in axes):
        raise InvalidArgument(f"zero_extents={value!r}, but it must be a sequence of axes ('m', 'k', 'n')")
    return tuple(a for a in "mkn" if a in axes and a in rules.zero_extents)


def _shapes(shapes: Any, shp: Any, rules: Convention, convention: str | None, fams: tuple[str, ...],
            pairs: tuple, tiling: tuple[int, int, int], multiples: dict[str, int]
            ) -> tuple[tuple[int, int, int], ...] | None:
    if shp is None:
        return None
    try:
        shp = tuple(tuple(int(v) for v in s) for s in shp)
    except (TypeError, ValueError):
        raise InvalidArgument(f"shapes={shapes!r}, but it must be a sequence of (M, K, N) tuples") from None
    if not shp or any(len(s) != 3 or min(s) < 0 for s in shp):
        raise InvalidArgument(f"shapes={shapes!r}, but it must be a non-empty sequence of (M, K, N) >= 0")
    for s in shp:
        for f in fams:
            for i_dt, _ in pairs:
                for i, axis in enumerate("mkn"):
                    mult = math.lcm(rules.axis_multiple(axis, f, tiling, i_dt), multiples.get(axis, 1))
                    if s[i] % mult:
                        raise InvalidArgument(
                            f"shapes={shapes!r}, but convention={convention!r} needs {axis.upper()} to be a "
                            f"multiple of {mult} (family {f!r}, dtype {i_dt}, tiling={tiling}); {s} is not"
                        )
    return shp


def config(draw: Any, convention: str | None, families: Any, dtypes: Any, tiling: Any, min_groups: Any,
           max_groups: Any, max_extent: Any, max_batch_dims: Any, sharding: Any, max_shards: Any,
           existing_out: Any, shapes: Any, max_buckets: Any, vary_out_dtype: Any, multiple_of: Any = None,
           zero_extents: Any = None, quantizations: Any = None, storages: Any = None, layouts: Any = None,
           operand_alignment: Any = None) -> Config:
    """The validated :class:`Config` of ``problems()``'s arguments (strategy arguments drawn in order)."""
    rules = rules_of(convention)
    names, fams = _layouts(layouts, rules, convention, _families(families, rules, convention))
    check_bool("vary_out_dtype", vary_out_dtype, allow_none=True)
    pairs = _dtype_pairs(resolve(draw, dtypes), rules, convention, vary_out_dtype)
    t = resolve(draw, tiling)
    given_t = t is not None
    t = check_tiling(t) if given_t else (rules.default_tiling or (SMALL_TILE,) * 3)
    lo = check_int("min_groups", resolve(draw, min_groups), minimum=1, maximum=MAX_GROUPS)
    hi = check_int("max_groups", resolve(draw, max_groups), minimum=1, maximum=MAX_GROUPS)
    if lo > hi:
        raise InvalidArgument(f"min_groups={lo} is greater than max_groups={hi}")
    counts = tuple(sorted({v for v in (lo, 2, 3, 4, hi) if lo <= v <= hi}))
    me = resolve(draw, max_extent)
    me = 3 * max(t) + 16 if me is None else check_int("max_extent", me, minimum=1, maximum=MAX_EXTENT)
    mbd = resolve(draw, max_batch_dims)
    mbd = rules.max_batch_dims if mbd is None else check_int("max_batch_dims", mbd, minimum=0)
    if mbd > rules.max_batch_dims:
        raise InvalidArgument(
            f"max_batch_dims={mbd}, but convention={convention!r} takes at most {rules.max_batch_dims} batch dims")
    sh = check_bool("sharding", resolve(draw, sharding), allow_none=True)
    _sharding(sh, rules, convention, hi, fams)
    ms = check_int("max_shards", resolve(draw, max_shards), minimum=1, maximum=MAX_GROUPS)
    if sh and ms < 2:
        raise InvalidArgument(f"sharding=True, but max_shards={ms} allows only one shard")
    if sh:
        counts = tuple(c for c in counts if any(c % s == 0 for s in range(2, ms + 1))) or counts
        fams = tuple(f for f in fams if family_records.get(f).takes_sizes)  # sharded always: batch has no shards
    ex = check_bool("existing_out", resolve(draw, existing_out), allow_none=True)
    if ex and rules.existing_policy is None:
        raise InvalidArgument(f"existing_out=True, but convention={convention!r} takes no existing output")
    if ex is False and rules.existing_required:
        raise InvalidArgument(f"existing_out=False, but convention={convention!r} always writes into an existing "
                              f"output ({rules.existing_argument})")
    multiples = _multiples(multiple_of)
    shp = _shapes(shapes, resolve(draw, shapes), rules, convention, fams, pairs, t, dict(multiples))
    mb = resolve(draw, max_buckets)
    if mb is not None:
        mb = check_int("max_buckets", mb, minimum=1)
    zero = _zero_extents(zero_extents, rules)
    quants = _quantizations(quantizations, rules, convention)
    if quants is not None:  # the families that take one of the chosen quantizations
        fams = tuple(f for f in fams if any(q in rules.quantizations_for(f) for q in quants))
        if not fams:
            raise InvalidArgument(f"quantizations={quantizations!r}, but convention={convention!r} takes none of them "
                                  f"in families={families!r}")
    return Config(convention, rules, multiples, fams, pairs, t, given_t, counts, lo, hi, me, mbd, sh, ms, ex, shp, mb,
                  zero, quants, _storages(storages), names, _alignment(operand_alignment))


def _layouts(value: Any, rules: Convention, convention: str | None, fams: tuple[str, ...]
             ) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """(the layout names asked for, in ``LAYOUT_NAMES``' order, or None for all; the families with one of them)."""
    if value is None:
        return None, fams
    names = (value,) if isinstance(value, str) else tuple(value)
    if not names or any(n not in LAYOUT_NAMES for n in names):
        raise InvalidArgument(f"layouts={value!r}, but it must be a non-empty sequence of {LAYOUT_NAMES}")
    kept = tuple(f for f in fams if named(rules.layouts_of(f), names))
    if not kept:
        raise InvalidArgument(f"layouts={value!r}, but convention={convention!r} takes none of them in "
                              f"families={fams!r}")
    return tuple(n for n in LAYOUT_NAMES if n in names), kept


def _alignment(value: Any) -> tuple[int, int]:
    """``{"lhs": bytes, "rhs": bytes}`` (an operand not named: any) or one int for both, as (lhs, rhs) bytes."""
    if value is None:
        return (1, 1)
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"lhs": value, "rhs": value}
    ok = isinstance(value, Mapping) and not set(value) - {"lhs", "rhs"} and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 and not n & (n - 1) for n in value.values())
    if not ok:
        raise InvalidArgument(f"operand_alignment={value!r}, but it must be a power of two of bytes, or map 'lhs' "
                              "and/or 'rhs' to one")
    return value.get("lhs", 1), value.get("rhs", 1)


def _storages(value: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``{"lhs": kinds, "rhs": kinds}`` (an operand not named: every storage) as (lhs kinds, rhs kinds)."""
    if value is None:
        return (STORAGES, STORAGES)
    if not isinstance(value, Mapping) or set(value) - {"lhs", "rhs"}:
        raise InvalidArgument(f"storages={value!r}, but it must map 'lhs' and/or 'rhs' to some of {STORAGES}")
    out = []
    for operand in ("lhs", "rhs"):
        kinds = value.get(operand, STORAGES)
        kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        if not kinds or any(k not in STORAGES for k in kinds):
            raise InvalidArgument(f"storages[{operand!r}]={value.get(operand)!r}, but it must be some of {STORAGES}")
        out.append(tuple(k for k in STORAGES if k in kinds))
    return out[0], out[1]


def _quantizations(value: Any, rules: Convention, convention: str | None) -> tuple[tuple[Any, Any], ...] | None:
    if value is None:
        return None
    try:
        pairs = tuple(tuple(p) for p in value)
    except TypeError:
        pairs = ((),)
    if not pairs or any(len(p) != 2 or p not in rules.quantizations for p in pairs):
        raise InvalidArgument(f"quantizations={value!r}, but convention={convention!r} takes the (lhs, rhs) pairs "
                              f"{list(rules.quantizations)} (a non-empty selection of them)")
    return pairs
