"""The call sandbox: everything between the harness and one call of a kernel it does not trust.

A kernel gets fresh copies of its inputs inside guarded allocations (``guards``, ``inputs``), converted to its
framework exactly (``convert``) on the device it runs on (``device``); a write past a buffer, a changed input or an
exit of the process is a reported failure, never a corrupted verdict. Gradients (``autodiff``), CUDA graph replay
(``cuda_graph``) and one compiled program serving every group-size vector (``compilation``) call the kernel the
same way. ``KernelAdapter.invoke`` is the one place a kernel is called; these modules are what it calls through.
"""
