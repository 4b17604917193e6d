"""The ranks of one engine meet at the release/resume boundary over torch.distributed's TCPStore
(a real one here, its ranks played by threads): a barrier passes when all arrive, and one that
times out names the rank that did not; a scheduler's status record is written before it waits,
and a failed barrier turns its outcome into a failure naming that rank."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from coldsnap.distributed import BarrierTimeout
from coldsnap.plugin import Settings, StatusFile
from coldsnap.plugin._ranks import RankSync, StoreUnavailable


@pytest.fixture
def store() -> Any:
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))


def client(store: Any) -> Any:
    """A rank's own connection to the store (as each rank process has): one client shared by
    threads would hold every set behind another thread's blocking wait."""
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))


def test_two_ranks_meet_at_one_operations_barrier(store: Any) -> None:
    waited: dict[int, float] = {}

    def rank(r: int) -> None:
        waited[r] = RankSync(r, 2, 10.0, client(store)).sync("op-1", "released")

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert sorted(waited) == [0, 1] and max(waited.values()) < 5.0


def test_a_rank_that_does_not_arrive_is_named(store: Any) -> None:
    with pytest.raises(BarrierTimeout, match=r"rank 1 of 2 did not arrive") as err:
        RankSync(0, 2, 0.5, store).sync("op-2", "resumed")
    assert err.value.missing == (1,) and err.value.arrived == (0,)


def test_barriers_of_two_operations_do_not_mix(store: Any) -> None:
    """Rank 1 passed op-3 earlier: that does not let rank 0 through op-4."""
    with pytest.raises(BarrierTimeout, match="rank 0 of 2"):
        RankSync(1, 2, 0.3, store).sync("op-3", "resumed")
    with pytest.raises(BarrierTimeout, match="rank 1 of 2"):
        RankSync(0, 2, 0.3, store).sync("op-4", "resumed")


def test_a_single_rank_meets_nobody_and_needs_no_store() -> None:
    assert RankSync(0, 1, 1.0).sync("op", "released") == 0.0


def test_ranks_agree_before_a_collective_and_a_refusal_is_everyones(store: Any) -> None:
    """Stage 1 of a resume: rank 1 refuses, so rank 0 learns it before it rebuilds NCCL."""
    said: dict[int, list[int]] = {}

    def rank(r: int, ok: bool) -> None:
        said[r] = RankSync(r, 2, 10.0, client(store)).agree("op-6", "staged", ok=ok)

    threads = [threading.Thread(target=rank, args=(r, r == 0)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert said == {0: [1], 1: [1]}
    assert RankSync(0, 1, 1.0).agree("op-7", "staged", ok=False) == [0]


def test_a_scheduler_without_torch_distributed_has_no_store() -> None:
    with pytest.raises(StoreUnavailable, match="not initialised"):
        RankSync(0, 2, 1.0).sync("op-8", "released")


def test_a_failed_barrier_fails_the_ranks_outcome_after_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: Any
) -> None:
    import coldsnap.plugin._scheduler as sched

    status = StatusFile(tmp_path, "scheduler-tp0", {})
    hooks = sched.SchedulerHooks(Settings(rank_timeout_s=0.3), status)
    seen: list[dict[str, Any]] = []

    class Sync(RankSync):
        def sync(self, operation: str | None, phase: str) -> float:
            seen.append(dict(status.record))  # what the record said while waiting
            return super().sync(operation, phase)

    monkeypatch.setattr(hooks, "_ranks", lambda group: Sync(0, 2, 0.3, store))
    hooks._report(None, "op-5", "resumed", outcome="ok", error=None)
    assert seen[0]["outcome"] == "ok" and seen[0]["operation"] == "op-5"
    record = status.record
    assert record["outcome"] == "failed"
    assert "rank 1 of 2 did not arrive" in record["error"]
    assert record["events"][-1]["event"] == "resumed_barrier_failed"
