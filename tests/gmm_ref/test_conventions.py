"""The convention registry: every registered convention's facts agree with each other and with its code.

For each convention: its facts are well formed; every family it lists yields
problems that it expresses (drawn by the strategies from those same facts);
its arguments round-trip through its parser and its front-end gives the same
reference; it refuses what it cannot express, naming why; and no code outside
``gmm_ref/conventions`` branches on its name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import gmm_ref
from gmm_ref import FAMILIES, conventions
from gmm_ref import dtypes as _dt
from gmm_ref.conventions.base import ragged_last
from property_tests import strategies as gst

NAMES = conventions.names()
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
FAMILY_CASES = [pytest.param(n, f, id=f"{n}-{f}") for n in NAMES for f in conventions.get(n).families]
ROOT = Path(__file__).resolve().parents[2]


def test_the_builtin_conventions_are_registered():
    assert set(NAMES) >= {"ragged_dot", "ragged_dot_general", "megablox.gmm", "megablox.tgmm",
                          "torch.grouped_mm", "te.grouped_gemm"}
    with pytest.raises(ValueError, match="convention: expected one of"):
        conventions.get("no.such.convention")


@pytest.mark.parametrize("name", NAMES)
def test_facts_are_well_formed(name):
    c = conventions.get(name)
    assert c.name == name and c.framework in ("jax", "torch")
    assert set(c.families) <= set(FAMILIES) and set(c.default_families or c.families) <= set(c.families)
    for fam in c.families:
        layouts = c.layouts_of(fam)
        assert layouts, f"{name}: no layout for {fam}"
        for lt, rt, packed in layouts:
            assert not packed or ragged_last(fam, lt, rt), f"{name}: packed {fam} layout without a ragged last axis"
    assert c.dtype_pairs
    for i, o in c.dtype_pairs:
        assert (i in _dt.INPUT_DTYPES or (i in _dt.CODE_ONLY_DTYPES and i in c.code_dtypes)) and o in _dt.OUTPUT_DTYPES
        # integer inputs give integer outputs, but for integer codes with scales (a float output)
        assert _dt.is_integer(i) == _dt.is_integer(o) or (c.quantizations and not _dt.is_integer(o))
    for pair in c.quantizations:  # each a (lhs, rhs) pair whose codes are among the input dtypes
        if pair == (None, None):  # it takes unscaled operands too: of some dtype that is no code dtype of it
            assert any(i not in c.code_dtypes for i, _ in c.dtype_pairs), name
            continue
        assert len(pair) == 2 and any(q is not None for q in pair)
        assert all(q is None or q.elem in {i for i, _ in c.dtype_pairs} for q in pair), pair
        assert not c.out_dtype_is_input or i == o
    assert c.tail in ("zero", "undefined") and c.foreign in ("zero", "undefined")
    assert c.empty in ("zero", "untouched", "undefined")
    assert c.existing_policy in (None, "overwrite", "accumulate")
    assert (c.existing_argument is None) == (c.existing_policy is None)
    assert c.max_batch_dims >= 0
    for axis, req in c.multiple_of:
        assert axis in ("m", "k", "n", "ragged") and (req in ("tm", "tk", "tn", "16B") or isinstance(req, int))
    assert c.parse.__doc__, f"{name}: its parser documents the front-end"


def _check_family(name: str, family: str) -> None:
    conv = conventions.get(name)

    @SETTINGS
    @given(gst.problems(convention=name, families=(family,)))
    def prop(p):
        assert p.convention == name and p.family == family
        assert conv.refusal(p) is None, conv.refusal(p)
        args, kwargs = gmm_ref.arguments(p)
        q = conv.parse(*args, **kwargs)
        assert (q.family, q.out_shape, q.out_dtype, q.convention) == (p.family, p.out_shape, p.out_dtype, name)
        assert (q.existing_out is None) == (p.existing_out is None)
        assert q.empty == p.empty and (q.tail == p.tail or family == "batch")  # batch has no tail
        assert p.existing_out is None or q.existing_policy == p.existing_policy
        want, got = gmm_ref.reference(p), conv.reference(*args, **kwargs)
        np.testing.assert_array_equal(got.mask, want.mask)
        np.testing.assert_array_equal(np.where(want.mask, got.exact, 0), np.where(want.mask, want.exact, 0))

    prop()


@pytest.mark.parametrize(("name", "family"), FAMILY_CASES)
def test_every_listed_family_yields_problems_it_expresses_and_they_round_trip(name, family):
    _check_family(name, family)


class _RefusesTransposedRhs(type(conventions.get("megablox.gmm"))):
    """A convention whose facts list a layout its own refusal rejects (facts that disagree)."""

    def _refusal(self, p):
        return "no transposed rhs" if p.rhs_transposed else None


class _LosesTheTransposition(type(conventions.get("megablox.gmm"))):
    """A convention whose argument builder drops a fact (the transposition): no round trip."""

    def _arguments(self, p):
        args, kwargs = super()._arguments(p)
        return args, {**kwargs, "transpose_rhs": False}


@pytest.mark.parametrize("broken", [_RefusesTransposedRhs, _LosesTheTransposition])
def test_the_registry_check_catches_facts_that_disagree(monkeypatch, broken):
    import dataclasses

    fake = dataclasses.replace(conventions.get("megablox.gmm"), name="broken.gmm")
    fake.__class__ = broken
    monkeypatch.setitem(conventions.registry(), "broken.gmm", fake)
    with pytest.raises((AssertionError, ValueError)):  # a failed check, or its own parser refusing
        _check_family("broken.gmm", "ragged_m")


@pytest.mark.parametrize("name", NAMES)
def test_it_refuses_what_it_cannot_express_and_says_why(name):
    conv = conventions.get(name)
    other = next((f for f in FAMILIES if f not in conv.families), None)
    rng = np.random.default_rng(0)
    shapes = {"ragged_m": ((8, 8), (2, 8, 8)), "ragged_n": ((2, 8, 8), (8, 8)), "ragged_k": ((8, 8), (8, 8)),
              "batch": ((2, 8, 8), (2, 8, 8)), "masked": ((2, 8, 8), (2, 8, 8)),
              "padded_contiguous": ((8, 8), (2, 8, 8))}
    if other is not None:
        ls, rs = shapes[other]
        p = gmm_ref.Problem(other, rng.standard_normal(ls).astype(np.float32),
                            rng.standard_normal(rs).astype(np.float32),
                            None if other == "batch" else np.array([3, 5]), convention=name,
                            alignment=1 if other == "padded_contiguous" else None)
        assert other in conv.refusal(p)
        with pytest.raises(ValueError, match=f"convention: '{name}' cannot express this problem"):
            gmm_ref.arguments(p)
    if "ragged_m" in conv.families and not conv.sharding:  # in a layout it takes, so that sharding is the reason
        _, rt, _ = conv.layouts_of("ragged_m")[0]
        sharded = gmm_ref.Problem("ragged_m", np.ones((8, 32), np.float32), np.ones((1, 32, 32), np.float32),
                                  np.array([2, 2]), group_offset=1, num_local_groups=1, rhs_transposed=rt)
        assert "group_offset" in conv.refusal(sharded)


def test_a_problem_without_a_convention_has_no_arguments():
    p = gmm_ref.Problem("ragged_m", np.ones((4, 2), np.float32), np.ones((1, 2, 2), np.float32), np.array([4]))
    with pytest.raises(ValueError, match="names no convention"):
        gmm_ref.arguments(p)


def _string_branches(path: Path, names: set[str], root: Path = ROOT) -> list[str]:
    """Comparisons with, and dict keys of, a convention's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        consts = []
        if isinstance(node, ast.Compare):
            consts = [c for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
            for c in node.comparators:
                if isinstance(c, (ast.Tuple, ast.List, ast.Set)):
                    consts += [e for e in c.elts if isinstance(e, ast.Constant)]
        elif isinstance(node, ast.Dict):
            consts = [k for k in node.keys if isinstance(k, ast.Constant)]
        found += [f"{path.relative_to(root)}:{c.lineno} {c.value!r}" for c in consts if c.value in names]
    return found


def test_no_code_branches_on_a_conventions_name():
    names = set(NAMES)
    files = [p for pkg in ("gmm_ref", "gmm_kernels", "golden", "property_tests") for p in (ROOT / pkg).rglob("*.py")
             if "tests" not in p.parts and "conventions" not in p.parts]
    found = [hit for path in files for hit in _string_branches(path, names)]
    assert not found, "branches on a convention's name (read its Convention instead):\n" + "\n".join(found)


def test_the_name_check_sees_a_branch(tmp_path):
    (tmp_path / "x.py").write_text('if conv in ("megablox.gmm", "x"):\n    pass\nd = {"torch.grouped_mm": 1}\n')
    assert _string_branches(tmp_path / "x.py", set(NAMES), tmp_path) == ["x.py:1 'megablox.gmm'",
                                                                          "x.py:3 'torch.grouped_mm'"]
