"""Replicas of one n610 capsule restored by real CRIU on the toy engine: every restore takes the
image's PIDs and environment (its runtime dir among it). The stop of a replica that crashed
leaves the replica restored after it, which holds its PID now; a restore that fails while a
replica serves leaves that replica's runtime dir; the last stop removes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from coldsnap import Machine
from coldsnap.backends.procs import kill_tree, running

from ._toy import answers, capture_request, live_engines, needs_criu, restore_request

pytestmark = [needs_criu, pytest.mark.criu, pytest.mark.xdist_group("toys")]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("replicas", numbered=True)


@pytest.fixture(scope="module")
def model(root: Path) -> Path:
    from coldsnap.testing.toy_engine import build_toy_model

    return build_toy_model(root / "model", hidden=256, layers=2)


def test_replicas_of_one_capsule_are_told_apart(root: Path, model: Path) -> None:
    capture = capture_request(root, model, "n610", "native", "rep")
    captured = Machine.for_request(capture).capture(capture)
    assert captured.ok, captured.error

    def restore(workdir: str):  # type: ignore[no-untyped-def]
        request = restore_request(root, model, "n610", "native", "rep", workdir)
        machine = Machine.for_request(request)
        return machine, machine.restore(request)

    machine, first = restore("replica-1")
    assert first.ok, first.error
    kill_tree(first.facts["engine_pid"])  # the first replica crashes
    _, second = restore("replica-2")
    assert second.ok, second.error
    pid, runtime = second.facts["engine_pid"], Path(second.facts["runtime_dir"])
    try:
        assert pid == first.facts["engine_pid"] and runtime == Path(first.facts["runtime_dir"])
        assert second.facts["engine_start"] != first.facts["engine_start"]
        expected = answers(second.facts["engine_url"])

        stopped = machine.stop(first)  # the crashed replica's stop
        assert stopped.ok, stopped.error
        assert running(pid, started=second.facts["engine_start"]), "it stopped the live replica"
        assert runtime.is_dir(), "it removed the live replica's runtime dir"
        assert answers(second.facts["engine_url"]) == expected

        _, third = restore("replica-3")  # the image's PIDs are taken: it fails
        assert third.outcome == "rolled_back", third.error
        assert running(pid, started=second.facts["engine_start"])
        assert runtime.is_dir(), "the failed restore's compensation removed the live one's dir"
        assert answers(second.facts["engine_url"]) == expected
    finally:
        last = machine.stop(second)
    assert last.ok, last.error
    assert not running(pid) and not runtime.exists()
    assert not live_engines()
