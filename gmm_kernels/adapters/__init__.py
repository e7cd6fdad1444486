"""The built-in kernel adapters, one module per convention (named like its module in ``gmm_ref/conventions/``).

Each module holds every adapter whose ``convention`` is one of that convention module's conventions, whatever
package the kernel comes from (``ragged_dot`` holds jax.lax's, Mosaic GPU's, tokamax's and qwix's
``ragged_dot_qt``); what one package's adapters in several modules share is in a private module
(``_tokamax``, ``_torchao``). :mod:`gmm_kernels.registry` lists them; import adapters from there or by name
(``gmm_kernels.get("jax.ragged_dot")``).
"""
