"""Kernels that try to pass without computing the product, one per published way of gaming a checker, and
their honest twins.

Each is a ``torch.grouped_mm`` kernel (torch tensors in, a tensor out) built on the corpus's correct
float32 kernel, so that what differs from its twin is the cheat alone. The suite asserts that the default run
rejects every cheat with a message saying what it did, and that every honest twin passes.
"""

from __future__ import annotations

import itertools
import random

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


#: cheats whose verdict is INTERMITTENT: wrong on some calls of a problem and right on others
INTERMITTENT = [wrong_every_fourth_call, wrong_when_racing]

#: (cheat, what its rejection must say) for the ``torch.grouped_mm`` convention
CHEATS = {
    lazy_subclass_output: "Wrong groups:",
    dispatching_subclass_output: "__torch_dispatch__: it has no storage of its own to judge",
    array_like_output: "expected a numpy.ndarray, torch.Tensor or jax.Array, got _ArrayLike",
}

#: (cheat, what its rejection must say) in the ``graph`` mode, whose calls reuse the first call's buffers (the same
#: addresses) with new contents: caught there on every run, not when the allocator happens to reuse an address
GRAPH_CHEATS = {
    cached_by_address: "of one shape in the same buffers",
    cached_by_address_and_sizes: "of one shape in the same buffers",
}

#: kernels that look like a cheat in form but compute the product: each must pass
HONEST = [grouped_mm_correct, plain_subclass_output]
