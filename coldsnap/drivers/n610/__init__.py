"""n610: the whole initialized engine tree and its CUDA context, weights and KV left out."""

from ._driver import N610Driver, default_cuda

__all__ = ["N610Driver", "default_cuda"]
