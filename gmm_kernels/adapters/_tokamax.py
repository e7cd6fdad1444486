"""What tokamax's two adapters share (absl flags parsed before tokamax reads them):
:class:`~gmm_kernels.adapters.ragged_dot.TokamaxRaggedDot` (``ragged_dot`` convention) and
:class:`~gmm_kernels.adapters.qwix.TokamaxQArrayRaggedDot` (``qwix.ragged_dot``).
"""

from __future__ import annotations

__all__ = ["absl_flags_parsed"]


def absl_flags_parsed() -> None:
    """Parse absl flags with defaults only, unless the application already did.

    tokamax reads its config flags on first use and, if absl has not parsed
    the command line, calls ``flags.FLAGS(sys.argv)``: under pytest (or any
    program with its own options) that raises ``UnrecognizedFlagError: Unknown
    command line flag 'q'``. Parsing just the program name keeps the defaults.
    """
    import sys

    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS(sys.argv[:1])
