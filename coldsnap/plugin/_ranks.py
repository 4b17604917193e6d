"""The TP ranks of one engine meet at the release/resume boundary through the store that
torch.distributed already runs for SGLang (the TCPStore of its rendezvous, hosted by rank 0):
no coordinator of our own. Every barrier has a timeout and, when it runs out, names the ranks
that did not arrive (coldsnap.distributed).

Each barrier is named after the operation (the request id the health gate stamps on every
release and resume, the same on every rank) and a phase, so no name is used twice: keys are
never deleted, and a restored n610 image brings the store back with the keys it held at the
dump, none of which a later operation's fresh id can meet.
"""

from __future__ import annotations

import os
from typing import Protocol

from coldsnap._errors import PluginError
from coldsnap.distributed import KeyValueStore, RankBarriers


class RankStore(KeyValueStore, Protocol):
    """torch.distributed's Store as the ranks use it: barriers, and reading what a rank said."""

    def get(self, key: str) -> bytes: ...


class StoreUnavailable(PluginError, RuntimeError):
    """A multi-rank engine without torch.distributed's store: its ranks cannot meet."""


def default_store() -> RankStore:
    """The store of torch.distributed's default group (SGLang's rendezvous)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise StoreUnavailable(
            "torch.distributed is not initialised in this scheduler, so its ranks have no "
            "store to meet at"
        )
    return dist.distributed_c10d._get_default_store()


class RankSync:
    """This rank's barriers with the other ranks of its TP group (`timeout_s`: the settings'
    COLDSNAP_RANK_TIMEOUT_S).

    A single-rank group meets nobody: it returns at once and needs no store."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        timeout_s: float,
        store: RankStore | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._store = store

    def sync(self, operation: str | None, phase: str) -> float:
        """Waits until every rank of the group has reached `phase` of `operation`; returns the
        seconds waited. BarrierTimeout names the ranks that did not arrive; BarrierError a store
        that failed."""
        if self.world_size == 1:
            return 0.0
        return self._barriers(operation).sync(phase, note=str(os.getpid()))

    def agree(self, operation: str | None, phase: str, *, ok: bool) -> list[int]:
        """A barrier at which each rank also says whether it can go on (the value of its key);
        returns the ranks that cannot. BarrierTimeout names the ranks that did not arrive."""
        if self.world_size == 1:
            return [] if ok else [self.rank]
        barrier = self._barriers(operation).barrier(phase)
        barrier.sync(self.rank, note="ok" if ok else "refused")
        store = self._store
        assert store is not None  # set by _barriers
        return [r for r in range(self.world_size) if store.get(barrier.key(r)) != b"ok"]

    def _barriers(self, operation: str | None) -> RankBarriers:
        if self._store is None:
            self._store = default_store()
        return RankBarriers(
            self._store,
            self.rank,
            self.world_size,
            self.timeout_s,
            generation=operation or "no-operation",
        )


__all__ = ["RankStore", "RankSync", "StoreUnavailable", "default_store"]
