"""Named barriers over a key-value store (torch.distributed's TCPStore and its kin).

Each rank that arrives sets one key of its own (`<prefix>/<name>/<rank>`), so after a timeout
the store itself says who is missing: a plain counter (`store.add`) could only say how many.
Waiting is the store's own blocking `wait` on all the keys; only when it times out are the
keys checked one by one to name the ranks that did not arrive.

Keys are never deleted: a barrier name is used once per store (put a generation in the name,
e.g. `restored/2`, to pass the same point again). That is also what makes a restored snapshot
safe: the store comes back with the keys it held at the dump.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

from coldsnap._errors import OperationError

DEFAULT_PREFIX = "coldsnap/barrier"


class KeyValueStore(Protocol):
    """The part of torch.distributed.Store a barrier uses."""

    def set(self, key: str, value: str | bytes) -> None: ...
    def check(self, keys: list[str]) -> bool: ...
    def wait(self, keys: list[str], timeout: timedelta) -> None: ...


class BarrierError(OperationError):
    """A barrier could not complete: the store failed, or (BarrierTimeout) ranks are missing."""

    def __init__(self, name: str, message: str) -> None:
        self.name = name
        super().__init__(f"barrier {name!r}: {message}")


class BarrierTimeout(BarrierError):
    """Some ranks did not arrive within the timeout. `missing` and `arrived` are rank lists."""

    def __init__(
        self,
        name: str,
        *,
        missing: Sequence[int],
        arrived: Sequence[int],
        world_size: int,
        timeout_s: float,
    ) -> None:
        self.missing = tuple(missing)
        self.arrived = tuple(arrived)
        self.world_size = world_size
        self.timeout_s = timeout_s
        ranks = ", ".join(map(str, self.missing))
        super().__init__(
            name,
            f"rank{'s' if len(self.missing) != 1 else ''} {ranks} of {world_size} did not arrive "
            f"within {timeout_s:g} s (arrived: {list(self.arrived)})",
        )


def _positive(field: str, value: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{field}: {value!r} is not a number")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{field}: {value!r} must be a positive, finite number of seconds")
    return float(value)


class StoreBarrier:
    """One named barrier of `world_size` ranks over `store`.

    `arrive(rank)` marks a rank as there (and returns at once); `wait()` blocks until every
    rank has arrived or raises BarrierTimeout naming the missing ones; `sync(rank)` does both.
    Any process that reaches the store may wait on a barrier, a controller too.
    """

    def __init__(
        self,
        store: KeyValueStore,
        name: str,
        world_size: int,
        timeout_s: float,
        *,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        if not isinstance(name, str) or not name.strip("/"):
            raise ValueError(f"name: {name!r} must be a non-empty string")
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"world_size: {world_size!r} must be an integer >= 1")
        self.store = store
        self.name = name.strip("/")
        self.world_size = world_size
        self.timeout_s = _positive("timeout_s", timeout_s)
        self.prefix = prefix.rstrip("/")

    def __repr__(self) -> str:
        return (
            f"StoreBarrier({self.name!r}, world_size={self.world_size}, "
            f"timeout_s={self.timeout_s:g})"
        )

    def key(self, rank: int) -> str:
        """The store key rank `rank` sets when it arrives."""
        return f"{self.prefix}/{self.name}/{self._rank(rank)}"

    def _rank(self, rank: int) -> int:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank: {rank!r} is not in 0..{self.world_size - 1}")
        return rank

    def arrive(self, rank: int, note: str = "") -> None:
        """Marks `rank` as arrived; `note` (e.g. its pid) is stored as the key's value."""
        key = self.key(rank)
        try:
            self.store.set(key, note or "1")
        except Exception as exc:
            raise BarrierError(self.name, f"rank {rank} could not arrive: {exc}") from exc

    def arrived(self) -> list[int]:
        """The ranks that have arrived so far."""
        try:
            return [r for r in range(self.world_size) if self.store.check([self.key(r)])]
        except Exception as exc:
            raise BarrierError(self.name, f"the store could not say who arrived: {exc}") from exc

    def missing(self) -> list[int]:
        """The ranks that have not arrived yet."""
        arrived = set(self.arrived())
        return [r for r in range(self.world_size) if r not in arrived]

    def wait(self, timeout_s: float | None = None) -> float:
        """Blocks until every rank has arrived; returns the seconds waited. Raises
        BarrierTimeout (naming the missing ranks) after `timeout_s` (default: the barrier's),
        BarrierError when the store fails."""
        timeout = self.timeout_s if timeout_s is None else _positive("timeout_s", timeout_s)
        keys = [self.key(r) for r in range(self.world_size)]
        start = time.monotonic()
        try:
            self.store.wait(keys, timedelta(seconds=timeout))
            return time.monotonic() - start
        except Exception as exc:
            waited = time.monotonic() - start
            cause: BaseException = exc
        arrived = self.arrived()  # the store answers again after a wait timed out
        missing = [r for r in range(self.world_size) if r not in arrived]
        if not missing:  # the last rank came just as the wait gave up
            return waited
        if waited < timeout * 0.9:  # the wait failed early: not a timeout, the store broke
            raise BarrierError(
                self.name, f"waiting failed after {waited:.3f} s ({cause}); missing {missing}"
            ) from cause
        raise BarrierTimeout(
            self.name, missing=missing, arrived=arrived, world_size=self.world_size,
            timeout_s=timeout,
        ) from cause  # fmt: skip

    def sync(self, rank: int, timeout_s: float | None = None, note: str = "") -> float:
        """arrive(rank) then wait(); returns the seconds waited."""
        self.arrive(rank, note)
        return self.wait(timeout_s)


class RankBarriers:
    """One rank's view of a sequence of barriers over one store: `sync("restored")` is
    StoreBarrier(store, "restored", world_size, timeout_s).sync(rank). `generation` is put
    into every name (`<generation>/<name>`), so the same points can be passed again later."""

    def __init__(
        self,
        store: KeyValueStore,
        rank: int,
        world_size: int,
        timeout_s: float,
        *,
        generation: str = "",
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = _positive("timeout_s", timeout_s)
        self.generation = generation.strip("/")
        self.prefix = prefix
        self.barrier("check")._rank(rank)  # validates rank and world_size up front

    def barrier(self, name: str) -> StoreBarrier:
        full = f"{self.generation}/{name}" if self.generation else name
        return StoreBarrier(self.store, full, self.world_size, self.timeout_s, prefix=self.prefix)

    def sync(self, name: str, timeout_s: float | None = None, note: str = "") -> float:
        return self.barrier(name).sync(self.rank, timeout_s, note)
