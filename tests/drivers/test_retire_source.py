"""Retiring a captured source kills its whole tree at once.

The source is dumped and quiesced, so a graceful drain has nothing to save; SGLang's would only
start after its SIGTERM watchdog's next 5 s poll. The stand-in tree here notes every SIGTERM
it gets in a file and goes on running (root and child alike): a driver that asked it to drain
leaves that note, one that kills it at once leaves none."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coldsnap.backends.procs import kill_tree, pid_exists, tree_pids
from coldsnap.drivers.n580 import N580Driver
from coldsnap.drivers.n610 import N610Driver
from coldsnap.machine import LaunchCommand

# Root and child note SIGTERM and go on; the child's PID is written once both run.
_STUBBORN_TREE = textwrap.dedent(
    """
    import os, signal, sys, time
    def asked(*_):
        with open(sys.argv[1] + ".term", "a") as f:
            f.write(f"{os.getpid()}\\n")
    signal.signal(signal.SIGTERM, asked)
    child = os.fork()
    if child == 0:
        time.sleep(600)
        os._exit(0)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(child))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(600)
    """
)


def _start(driver: Any, tmp_path: Path) -> tuple[int, int]:
    """Starts the stand-in tree through the driver's own process tracker: (root, child)."""
    marker = tmp_path / "child.pid"
    command = LaunchCommand(
        argv=(sys.executable, "-c", _STUBBORN_TREE, str(marker)), url="http://127.0.0.1:1"
    )
    root = driver.processes.start(command, tmp_path / "engine.log")
    deadline = time.monotonic() + 10.0
    while not marker.exists():
        assert time.monotonic() < deadline, (tmp_path / "engine.log").read_text()
        time.sleep(0.01)
    return root, int(marker.read_text())


def _ctx(tmp_path: Path, pid: int) -> Any:
    """What retire_source reads of its step context (a capture's facts)."""
    return SimpleNamespace(
        facts={"engine_pid": pid, "runtime_dir": None},
        request=SimpleNamespace(operation="capture"),
        workdir=tmp_path,
    )


def _n610() -> N610Driver:
    return N610Driver(launcher=SimpleNamespace())  # type: ignore[arg-type]


def _n580() -> N580Driver:
    return N580Driver(launcher=SimpleNamespace(), preload=())  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [_n610, _n580], ids=["n610", "n580"])
def test_retire_source_kills_the_tree_at_once_and_reaps_it(make: Any, tmp_path: Path) -> None:
    driver = make()
    root, child = _start(driver, tmp_path)
    driver.retire_source(_ctx(tmp_path, root))
    assert not pid_exists(root), "the source's root still holds its PID (not reaped?)"
    assert not pid_exists(child), "the source's child still holds its PID"
    assert not (tmp_path / "child.pid.term").exists(), "retire_source asked for a drain"
    driver.retire_source(_ctx(tmp_path, root))  # a retried step finds nothing left: no error


def test_kill_tree_returns_the_roots_signal_and_leaves_no_pid(tmp_path: Path) -> None:
    driver = _n610()
    root, child = _start(driver, tmp_path)
    assert tree_pids(root) == [root, child]
    assert kill_tree(root) == -9
    assert not pid_exists(root) and not pid_exists(child)
    assert kill_tree(root) is None  # gone: nothing to kill, nothing to reap
    driver.processes.stop(root)  # forgets the launched tree


class _Cut(Exception):
    """The orchestrator killed part way through a kill (raised in its place)."""


@pytest.mark.parametrize("make", [_n610, _n580], ids=["n610", "n580"])
def test_a_retire_cut_short_after_one_kill_is_finished_by_its_retry(
    make: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retried step knows the root's PID only: the first kill must not orphan the rest."""
    import coldsnap.backends.procs as procs

    driver = make()
    root, child = _start(driver, tmp_path)
    real_kill = procs.os.kill

    def kill_once_then_die(pid: int, sig: int) -> None:
        real_kill(pid, sig)
        monkeypatch.setattr(procs.os, "kill", real_kill)
        raise _Cut

    monkeypatch.setattr(procs.os, "kill", kill_once_then_die)
    with pytest.raises(_Cut):
        driver.retire_source(_ctx(tmp_path, root))
    driver.retire_source(_ctx(tmp_path, root))  # the step's retry on resume
    assert not pid_exists(root), "the source's root still holds its PID"
    assert not pid_exists(child), "the source's child was orphaned by the cut kill and left running"
