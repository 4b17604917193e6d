"""Replicas of one n610 capsule served side by side, restored by real CRIU on the toy engine: a
restore takes back its image's PIDs, so a second one beside a running restore collides unless
it asks for a PID namespace of its own (`replica`); then both serve, each on its own port, and
the stop of one leaves the other serving."""

from __future__ import annotations

import socket
from pathlib import Path

import attrs
import pytest

from coldsnap import Machine
from coldsnap.backends.procs import running

from ._toy import answers, capture_request, live_engines, needs_criu, restore_request

pytestmark = [needs_criu, pytest.mark.criu, pytest.mark.xdist_group("toys")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("replica-ns", numbered=True)


@pytest.fixture(scope="module")
def model(root: Path) -> Path:
    from coldsnap.testing.toy_engine import build_toy_model

    return build_toy_model(root / "model", hidden=256, layers=2)


def test_a_replica_serves_beside_the_first_restore_and_outlives_its_stop(
    root: Path, model: Path
) -> None:
    capture = capture_request(root, model, "n610", "native", "ns")
    captured = Machine.for_request(capture).capture(capture)
    assert captured.ok, captured.error

    def restore(workdir: str, **kw):  # type: ignore[no-untyped-def]
        request = attrs.evolve(restore_request(root, model, "n610", "native", "ns", workdir), **kw)
        machine = Machine.for_request(request)
        return machine, machine.restore(request)

    machine, first = restore("first")
    assert first.ok, first.error
    first_stopped = False
    try:
        expected = answers(first.facts["engine_url"])

        _, collided = restore("collided", port=_free_port())  # the image's PIDs are taken
        assert collided.outcome == "rolled_back"
        assert "--replica" in collided.error and "replica: true" in collided.error
        assert answers(first.facts["engine_url"]) == expected

        replica_machine, replica = restore("replica", port=_free_port(), replica=True)
        assert replica.ok, replica.error
        pid, start = replica.facts["engine_pid"], replica.facts["engine_start"]
        assert pid != first.facts["engine_pid"]  # its host PID; in its namespace it has the image's
        assert replica.facts["engine_url"] != first.facts["engine_url"]
        assert answers(replica.facts["engine_url"]) == expected
        assert answers(first.facts["engine_url"]) == expected

        stopped = machine.stop(first)
        first_stopped = True
        assert stopped.ok, stopped.error
        assert not running(first.facts["engine_pid"], started=first.facts["engine_start"])
        assert running(pid, started=start), "the first restore's stop stopped the replica"
        assert Path(replica.facts["runtime_dir"]).is_dir(), "it removed the replica's runtime dir"
        assert answers(replica.facts["engine_url"]) == expected
    finally:
        if not first_stopped:
            machine.stop(first)
    last = replica_machine.stop(replica)
    assert last.ok, last.error
    assert not running(pid, started=start)
    assert not Path(replica.facts["runtime_dir"]).exists()
    assert not live_engines()
