"""epd: the encode stage of disaggregated multimodal serving, from Python.

The cache and scheduler classes are drop-ins for the engine reference's
``EmbeddingCache``, ``TieredEmbeddingCache``, ``EncodeScheduler`` and
``PendingEncodeItem``: same constructors, keywords, defaults, methods,
properties, errors and return values, backed by the C++ core.
"""

from ._version import __version__  # noqa: F401  (the CMake project's VERSION)
from ._core import (  # noqa: F401
    EmbeddingCache,
    EncodeScheduler,
    PendingEncodeItem,
    TieredEmbeddingCache,
)

__all__ = [
    "__version__",
    "EmbeddingCache",
    "EncodeScheduler",
    "PendingEncodeItem",
    "TieredEmbeddingCache",
]
