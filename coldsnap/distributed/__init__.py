"""Coordination of the ranks of a multi-rank engine around capture and restore.

Barriers over a store the ranks already share (torch.distributed's TCPStore, or any object
with its `set`/`check`/`wait` methods), not a coordinator of our own: every rank of a
tensor-parallel engine already reaches that store for its NCCL rendezvous. A barrier that
times out names the ranks that did not arrive. Imports nothing else of coldsnap.
"""

from ._barrier import (
    DEFAULT_PREFIX,
    BarrierError,
    BarrierTimeout,
    KeyValueStore,
    RankBarriers,
    StoreBarrier,
)

__all__ = [
    "DEFAULT_PREFIX",
    "BarrierError",
    "BarrierTimeout",
    "KeyValueStore",
    "RankBarriers",
    "StoreBarrier",
]
