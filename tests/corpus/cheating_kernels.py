"""Kernels that try to pass without computing the product, one per published way of gaming a checker, and
their honest twins.

Each is a ``torch.grouped_mm`` kernel (torch tensors in, a tensor out) built on the corpus's correct
float32 kernel, so that what differs from its twin is the cheat alone. The suite asserts that the default run
rejects every cheat with a message saying what it did, and that every honest twin passes.
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import threading
import time

import numpy as np

from tests.corpus.broken_kernels import grouped_mm_correct


# ------------------------------------------------------------ outputs that are not what they claim
def _lazy_class():
    import torch

    class LazyOutput(torch.Tensor):
        """Storage never written; the answer is computed only when the tensor is converted."""

        def __array__(self, dtype=None, copy=None):
            return self._answer.float().numpy()

        def numpy(self, *args, **kwargs):
            return self._answer.numpy()

    return LazyOutput


def lazy_subclass_output(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Returns zeros dressed as a tensor subclass that converts itself to the right answer."""
    import torch

    answer = grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)
    out = torch.zeros_like(answer).as_subclass(_lazy_class())
    out._answer = answer
    return out


def _dispatching_class():
    import torch

    class DispatchingOutput(torch.Tensor):
        """A wrapper subclass with no storage: every operation on it is answered by ``__torch_dispatch__``."""

        @staticmethod
        def __new__(cls, answer):
            made = torch.Tensor._make_wrapper_subclass(cls, answer.shape, dtype=answer.dtype)
            made._answer = answer
            return made

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            def unwrap(x):
                return x._answer if isinstance(x, cls) else x

            return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})

    return DispatchingOutput


def dispatching_subclass_output(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Returns a storage-less wrapper tensor whose every read is redirected to an answer held elsewhere."""
    return _dispatching_class()(grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype))


class _ArrayLike:
    def __init__(self, answer):
        self._answer = answer

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._answer.float().numpy(), dtype=dtype)


def array_like_output(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Returns no array at all: an object that converts itself into the answer when asked."""
    return _ArrayLike(grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype))


def plain_subclass_output(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Honest: the right values in a tensor subclass that overrides nothing."""
    import torch

    class Tagged(torch.Tensor):
        pass

    return grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype).as_subclass(Tagged)


# ------------------------------------------------------------ intermittent wrong answers
_CALLS = itertools.count()
_RACE = random.Random(20261128)


def _spoil(out):
    """``out`` with one element off, where it has one."""
    if out.numel():
        out.view(-1)[0] += 1.0
    return out


def wrong_every_fourth_call(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Right three calls in four (a counter kept across calls: a buffer reused every fourth time)."""
    out = grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)
    return _spoil(out) if next(_CALLS) % 4 == 3 else out


def wrong_when_racing(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Wrong on about one call in five at random, as a race between two writers is."""
    out = grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)
    return _spoil(out) if _RACE.random() < 0.2 else out


# ------------------------------------------------------------ results kept by the buffers' addresses
_BY_ADDRESS: dict = {}


def forget_kept_results() -> None:
    """Empty the results the address-keyed kernels kept: a test starts them as a fresh process would."""
    _BY_ADDRESS.clear()


def _address_key(mat_a, mat_b, offs, with_sizes):
    key = (mat_a.data_ptr(), mat_b.data_ptr(), tuple(mat_a.shape), tuple(mat_b.shape))
    if offs is not None:
        key += (offs.data_ptr(), *(offs.tolist() if with_sizes else ()))
    return key


def cached_by_address(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Computes once per set of input addresses and shapes, and returns that result for every later call."""
    key = _address_key(mat_a, mat_b, offs, with_sizes=False)
    if key not in _BY_ADDRESS:
        _BY_ADDRESS[key] = grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)
    return _BY_ADDRESS[key].clone()


def cached_by_address_and_sizes(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """As :func:`cached_by_address`, the group sizes part of the key: only new contents in the same buffers show."""
    key = ("sizes", *_address_key(mat_a, mat_b, offs, with_sizes=True))
    if key not in _BY_ADDRESS:
        _BY_ADDRESS[key] = grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)
    return _BY_ADDRESS[key].clone()


# ------------------------------------------------------------ the harness changed from inside
def _zeros_like_answer(mat_a, mat_b, offs, bias, out_dtype):
    return grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype) * 0


def patches_the_comparison(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Replaces gmm_ref's comparison with one that accepts anything, and returns zeros."""
    import gmm_ref

    gmm_ref.assert_matches_reference = lambda *args, **kwargs: None
    return _zeros_like_answer(mat_a, mat_b, offs, bias, out_dtype)


def patches_numpy(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Replaces NumPy functions a checker may compare with, and returns zeros."""
    np.allclose = lambda *args, **kwargs: True
    np.testing.assert_allclose = lambda *args, **kwargs: None
    return _zeros_like_answer(mat_a, mat_b, offs, bias, out_dtype)


def finishes_in_a_thread(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Returns an output still being written by a thread it started (a result finished behind the checker)."""
    answer = grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)
    out = answer * 0

    def finish():
        time.sleep(0.5)
        out.copy_(answer)

    threading.Thread(target=finish, daemon=True).start()
    return out


def _frame_local(names):
    frame = sys._getframe(2)
    while frame is not None:
        for name in names:
            if name in frame.f_locals:
                return frame.f_locals[name]
        frame = frame.f_back
    return None


def returns_the_expected_answer_from_the_callers_frames(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Walks up the stack for the checker's expected answer and returns it; zeros where there is none."""
    import torch

    from gmm_kernels.sandbox.convert import to_torch

    ref = _frame_local(("ref", "expected", "want"))
    if ref is not None and hasattr(ref, "exact"):
        return to_torch(np.asarray(ref.exact).astype(np.float32)).to(out_dtype or mat_a.dtype)
    return torch.zeros_like(_zeros_like_answer(mat_a, mat_b, offs, bias, out_dtype))


def zeroes_the_checkers_problem(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Finds the checker's own problem up the stack, zeroes its operands (so that a reference computed afterwards
    is zero) and returns zeros."""
    problem = _frame_local(("problem",))
    if problem is not None and hasattr(problem, "lhs"):
        for a in (problem.lhs, problem.rhs):
            a.setflags(write=True)
            a[...] = 0
    return _zeros_like_answer(mat_a, mat_b, offs, bias, out_dtype)


def _accept_anything(actual, problem_or_expected, *, numerics=None, kernel=None):
    return None


def rewrites_the_comparisons_code(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Keeps the comparison function (the same object) but swaps its code for one that accepts anything."""
    import gmm_ref.compare

    gmm_ref.compare.assert_matches_reference.__code__ = _accept_anything.__code__
    return _zeros_like_answer(mat_a, mat_b, offs, bias, out_dtype)


def makes_every_comparison_ok(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Adds a property to the comparison's result class so that every comparison says it is ok."""
    from gmm_ref.compare import Comparison

    Comparison.ok = property(lambda self: True, lambda self, value: None)
    return _zeros_like_answer(mat_a, mat_b, offs, bias, out_dtype)


def blinds_the_watcher(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Honest once, emptying the tamper watch's own list of what it watches; on later calls replaces the comparison
    (which, blinded, nothing would notice) and returns zeros."""
    import gmm_ref
    from gmm_kernels.sandbox import tamper

    if not tamper._WATCH.spaces:
        gmm_ref.assert_matches_reference = lambda *args, **kwargs: None
        return _zeros_like_answer(mat_a, mat_b, offs, bias, out_dtype)
    tamper._WATCH.spaces, tamper._WATCH.functions = [], []
    return grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)


#: cheats whose verdict is TAMPERED, and what the report names
def _log_forgery(line):
    log = os.environ.get("GMM_TEST_FORGERY_LOG")
    if log:
        with open(log, "a") as f:
            f.write(line + "\n")


def forges_the_workers_report(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Finds the main job's worker (itself, or the process that started it), appends a pass for every cell of the
    worker's request to the worker's report and ends the process; zeros where it cannot. Every attempt is logged
    to ``$GMM_TEST_FORGERY_LOG`` (the test reads it)."""
    import json

    import torch

    for pid in (os.getpid(), os.getppid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0") if a]
            if "property_tests.cli.worker" not in argv:
                _log_forgery(f"{pid}: not the worker")
                continue
            with open(argv[-2]) as f:
                cells = json.load(f)["cells"]
            with open(argv[-1].replace("/dev/fd/", f"/proc/{pid}/fd/"), "a") as events:
                for cell in cells:
                    events.write(json.dumps({"event": "start", "cell": cell, "extra": False}) + "\n")
                    events.write(json.dumps({"event": "cell", "cell": cell, "extra": False,
                                             "outcome": {"status": "pass", "examples": 50}}) + "\n")
                events.write(json.dumps({"event": "end"}) + "\n")
            _log_forgery(f"{pid}: forged")
            os._exit(0)
        except OSError as exc:
            _log_forgery(f"{pid}: {type(exc).__name__}")
    rows = mat_a.shape[0] if offs is not None and mat_a.dim() == 2 else 1
    return torch.zeros((rows, mat_b.shape[-1]), dtype=out_dtype or mat_a.dtype)


TAMPERING = {
    patches_the_comparison: "replaced gmm_ref.assert_matches_reference (put back)",
    patches_numpy: "replaced numpy.allclose (put back)",
    finishes_in_a_thread: "still running after the call",
    zeroes_the_checkers_problem: "changed the harness's own copy of the problem",
    rewrites_the_comparisons_code: "rewrote the code of gmm_ref.compare.assert_matches_reference (put back)",
    makes_every_comparison_ok: "gmm_ref.compare.Comparison.ok",
    blinds_the_watcher: "changed the harness's own list of what it watches (put back)",
}


#: cheats whose verdict is INTERMITTENT: wrong on some calls of a problem and right on others
INTERMITTENT = [wrong_every_fourth_call, wrong_when_racing]

#: (cheat, what its rejection must say) for the ``torch.grouped_mm`` convention
CHEATS = {
    lazy_subclass_output: "Wrong groups:",
    dispatching_subclass_output: "__torch_dispatch__: it has no storage of its own to judge",
    array_like_output: "expected a numpy.ndarray, torch.Tensor or jax.Array, got _ArrayLike",
    returns_the_expected_answer_from_the_callers_frames: "Wrong groups:",
}

#: (cheat, what its rejection must say) in the ``graph`` mode, whose calls reuse the first call's buffers (the same
#: addresses) with new contents: caught there on every run, not when the allocator happens to reuse an address
GRAPH_CHEATS = {
    cached_by_address: "of one shape in the same buffers",
    cached_by_address_and_sizes: "of one shape in the same buffers",
}

#: kernels that look like a cheat in form but compute the product: each must pass
HONEST = [grouped_mm_correct, plain_subclass_output]
