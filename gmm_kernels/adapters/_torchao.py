"""What the torchao adapters share: importing torchao without its known import-time log noise.

Used by :mod:`gmm_kernels.adapters.torch_grouped`, :mod:`~gmm_kernels.adapters.torchao` and
:mod:`~gmm_kernels.adapters.torch_scaled`.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

__all__ = ["quiet_torchao_import"]

#: what importing torchao (0.18) logs on a machine where its prebuilt CUDA extensions cannot load (any CPU-only
#: machine): a warning per extension from torchao's logger, and torch's deprecation of register_constant() on
#: the Enums torchao registers. Both are about torchao's own build, never about a kernel under test, and each
#: process that imports torchao prints them (the main job's workers, the xdist workers): only these messages,
#: only while the harness imports torchao, are dropped (quiet_torchao_import)
_IMPORT_NOISE = (
    ("torchao", re.compile(r"^Failed to load \S*torchao[/\\]_C[^/\\]*\.so: ")),
    ("torch.utils._pytree", re.compile(r"register_constant\(\) on Enum subclasses is deprecated")),
)


class _DropImportNoise(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


@contextlib.contextmanager
def quiet_torchao_import() -> Iterator[None]:
    """Import torchao inside this block without its known import-time log noise (``_IMPORT_NOISE``).

    The filters are on the two loggers for the block only: torchao's other messages, and anything your
    own kernel makes torchao or torch log later, still show (torchao logs these once per process, when it
    is first imported)."""
    filters = [(logging.getLogger(name), _DropImportNoise(pattern)) for name, pattern in _IMPORT_NOISE]
    for logger, f in filters:
        logger.addFilter(f)
    try:
        yield
    finally:
        for logger, f in filters:
            logger.removeFilter(f)
