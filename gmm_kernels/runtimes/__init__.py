"""Where a kernel's code runs and how it is loaded: Triton's interpreter with its known defects fixed
(``triton_interpreter``, ``triton_probes``), kernels read from a library's wheel (``wheels``), the built-in jax
adapters' compiled executables and JAX's persistent compilation cache kept on disk (``executables``,
``compile_cache``), and :func:`~gmm_kernels.runtimes.process.prepare_process`, the process set-up every entry point
runs before jax or a Triton kernel is imported (``process``).
"""
