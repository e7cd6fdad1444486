import numpy as np

import gmm_ref


def test_ragged_dot_reference_smoke():
    lhs = np.arange(12, dtype=np.float32).reshape(4, 3)
    rhs = np.ones((2, 3, 2), np.float32)
    out = gmm_ref.ragged_dot(lhs, rhs, np.array([1, 3], np.int32))
    np.testing.assert_array_equal(out, lhs.sum(1, keepdims=True).repeat(2, 1))
