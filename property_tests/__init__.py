"""property_tests: Hypothesis strategies and the property suite for grouped GEMM kernels.

``from property_tests import strategies as gst`` gives the public strategies;
``property_tests.check_kernel`` checks any kernel from Python. Importing this
package needs neither jax nor torch.
"""
