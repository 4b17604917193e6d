"""StoreBarrier over a real torch TCPStore, with ranks in real processes (CPU only)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coldsnap.distributed import BarrierError, BarrierTimeout, RankBarriers, StoreBarrier

dist = pytest.importorskip("torch.distributed")

REPO = Path(__file__).resolve().parents[2]

# A rank process: connects to the store, sleeps `delay`, then passes the barrier (or not).
RANK = textwrap.dedent(
    """
    import datetime, sys, time
    import torch.distributed as dist
    from coldsnap.distributed import BarrierTimeout, RankBarriers
    port, rank, world, name, timeout, delay = sys.argv[1:]
    store = dist.TCPStore("127.0.0.1", int(port), is_master=False,
                          timeout=datetime.timedelta(seconds=30))
    time.sleep(float(delay))
    barriers = RankBarriers(store, int(rank), int(world), float(timeout), generation="g1")
    try:
        waited = barriers.sync(name, note=str(rank))
    except BarrierTimeout as exc:
        print(exc, file=sys.stderr)
        print("missing", *exc.missing)
        sys.exit(3)
    print("passed", round(waited, 3))
    """
)


@pytest.fixture
def store():
    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip


def start_rank(port: int, rank: int, world: int, name: str, timeout: float, delay: float = 0.0):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", RANK, str(port), str(rank), str(world), name, str(timeout)]
    return subprocess.Popen(
        [*argv, str(delay)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_two_rank_processes_pass_and_a_controller_sees_them(store):
    procs = [start_rank(store.port, r, 2, "restored", 30.0) for r in (0, 1)]
    barrier = StoreBarrier(store, "g1/restored", 2, 30.0)
    barrier.wait()
    # the controller's wait returned because both ranks arrived, not because time ran out
    assert barrier.arrived() == [0, 1]
    results = [finish(p) for p in procs]
    for code, out, err in results:
        assert code == 0, err
        assert out.startswith("passed")
    # each rank's key holds its note (the rank), under the generation's name
    assert barrier.key(1) == "coldsnap/barrier/g1/restored/1"
    assert [store.get(barrier.key(r)) for r in (0, 1)] == [b"0", b"1"]


def test_a_rank_that_never_arrives_is_named(store):
    proc = start_rank(store.port, 0, 2, "resumed", 1.0)
    code, out, err = finish(proc)
    assert code == 3, (out, err)
    assert out.split() == ["missing", "1"]
    assert "barrier 'g1/resumed'" in err
    assert "rank 1 of 2 did not arrive within 1 s" in err
    assert "arrived: [0]" in err


def test_a_late_rank_is_waited_for(store):
    late = start_rank(store.port, 1, 2, "ready", 30.0, delay=1.0)
    barrier = StoreBarrier(store, "g1/ready", 2, 30.0)
    waited = barrier.sync(0)
    assert finish(late)[0] == 0
    assert waited > 0.3
    assert barrier.missing() == []


def test_timeout_in_process_names_every_missing_rank(store):
    barrier = StoreBarrier(store, "dumped", 3, 0.3)
    barrier.arrive(1)
    with pytest.raises(BarrierTimeout) as info:
        barrier.wait()
    assert info.value.missing == (0, 2)
    assert info.value.arrived == (1,)
    assert "ranks 0, 2 of 3 did not arrive" in str(info.value)
    assert barrier.arrived() == [1]
    # the store still answers after the timed-out wait: the stragglers can still pass, and the
    # wait then returns at once instead of running into its timeout
    barrier.arrive(0)
    barrier.arrive(2)
    assert barrier.missing() == []
    assert barrier.wait(5.0) < 2.5


def test_names_are_used_once_per_store(store):
    first = RankBarriers(store, 0, 1, 5.0, generation="1")
    first.sync("restored")
    second = RankBarriers(store, 0, 2, 0.2, generation="2")
    with pytest.raises(BarrierTimeout, match="'2/restored'"):
        second.sync("restored")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"world_size": 0}, "world_size"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"name": "/"}, "name"),
    ],
)
def test_bad_arguments_name_the_field(store, kwargs, field):
    args = {"name": "x", "world_size": 2, "timeout_s": 1.0, **kwargs}
    with pytest.raises(ValueError, match=field):
        StoreBarrier(store, args["name"], args["world_size"], args["timeout_s"])


def test_a_rank_outside_the_world_is_refused_before_touching_the_store(store):
    barrier = StoreBarrier(store, "x", 2, 1.0)
    with pytest.raises(ValueError, match=r"rank: 2 is not in 0\.\.1"):
        barrier.arrive(2)
    with pytest.raises(ValueError, match="rank"):
        RankBarriers(store, -1, 2, 1.0)
    assert barrier.arrived() == []


class BrokenStore:
    """A store whose connection is gone."""

    def set(self, key: str, value: str | bytes) -> None:
        raise RuntimeError("connection reset by peer")

    def check(self, keys: list[str]) -> bool:
        raise RuntimeError("connection reset by peer")

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        raise RuntimeError("connection reset by peer")


def test_a_broken_store_is_a_barrier_error_not_a_timeout():
    barrier = StoreBarrier(BrokenStore(), "restored", 2, 5.0)
    with pytest.raises(BarrierError, match="rank 0 could not arrive: connection reset") as info:
        barrier.arrive(0)
    assert not isinstance(info.value, BarrierTimeout)
    with pytest.raises(BarrierError, match="could not say who arrived") as info:
        barrier.wait()
    assert not isinstance(info.value, BarrierTimeout)
