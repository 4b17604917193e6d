"""Fixtures for the backends' tests: real processes, real CRIU (skipped cleanly without it)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coldsnap.backends import (
    Criu,
    Launched,
    become_subreaper,
    launch,
    reap,
    reap_children,
    stop_tree,
)
from tests._support import missing

TARGETS = Path(__file__).with_name("targets")


@pytest.fixture(scope="package", autouse=True)
def _subreaper() -> Iterator[None]:
    """While these tests run, the test process adopts what `criu restore -d` detaches, so it
    can reap it; afterwards it reaps what is left and stops adopting."""
    become_subreaper()
    yield
    reap_children()
    become_subreaper(enable=False)


@pytest.fixture(scope="session")
def criu() -> Criu:
    """The CRIU to test with ($COLDSNAP_CRIU, else what scripts/setup-criu.sh installs)."""
    found = Criu()
    problem = found.problem()
    if problem:
        missing("criu", f"no usable CRIU >= 4.2: {problem}")
    return found


def target(name: str, *args: object) -> list[str]:
    return [sys.executable, str(TARGETS / name), *map(str, args)]


def _ended(pid: int) -> str | None:
    """Why `pid` is no longer running (reaping it when it is ours), or None while it runs."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "it is gone"
    if state not in ("Z", "X"):
        return None
    code = reap(pid)
    if code is not None and code < 0:
        return f"it was killed by {signal.Signals(-code).name}"
    return f"it exited with {code}"


def wait_for_line(
    log: Path, pattern: str, *, after: int = 0, timeout: float = 30.0, pid: int | None = None
) -> re.Match:
    """Waits for a line matching `pattern` in `log` past byte offset `after`; fails at once
    if process `pid` ends first."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")[after:] if log.exists() else ""
        for line in text.splitlines():
            match = regex.search(line)
            if match:
                return match
        ended = _ended(pid) if pid is not None else None
        if ended:
            raise AssertionError(f"process {pid} ended before writing {pattern!r}: {ended}")
        time.sleep(0.01)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
    raise AssertionError(f"no line matching {pattern!r} in {log} within {timeout} s:\n{tail}")


def ask(pid: int, log: Path, pattern: str, timeout: float = 30.0) -> re.Match:
    """Sends SIGUSR1 and waits for the answer the target appends to its log."""
    offset = log.stat().st_size
    os.kill(pid, signal.SIGUSR1)
    return wait_for_line(log, pattern, after=offset, timeout=timeout, pid=pid)


@pytest.fixture
def cleanup() -> Iterator[Callable[[int], None]]:
    """Registers PIDs (trees) to stop and reap at the end of a test, whatever happens."""
    pids: list[int] = []
    yield pids.append
    for pid in reversed(pids):
        stop_tree(pid, timeout=5.0, sig=signal.SIGKILL)


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[Callable[..., Launched]]:
    """Starts targets with coldsnap's launcher and stops them after the test."""
    started: list[Launched] = []

    def start(argv: list[str], **kwargs: object) -> Launched:
        kwargs.setdefault("log_path", tmp_path / f"target-{len(started)}.log")
        proc = launch(argv, **kwargs)  # type: ignore[arg-type]
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop(timeout=5.0)


def proc_status(pid: int) -> dict[str, str]:
    """/proc/PID/status as fields."""
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def wait_for_zombie(pid: int) -> None:
    for _ in range(1000):
        if proc_status(pid)["State"].startswith("Z"):
            return
        os.sched_yield()
        subprocess.run(["true"])
    raise AssertionError(f"{pid} never became a zombie")


# Forks a child that exits at once, prints its PID, and reaps it only once a line arrives (or
# its stdin closes).
_REAPS_WHEN_TOLD = (
    "import os, sys\npid = os.fork()\nif pid == 0:\n    os._exit(0)\n"
    "print(pid, flush=True)\nsys.stdin.readline()\nos.waitpid(pid, 0)\nsys.stdin.read()\n"
)


def neglectful_parent() -> tuple[subprocess.Popen[str], int]:
    """A parent running _REAPS_WHEN_TOLD and its child, a zombie it has not reaped yet."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _REAPS_WHEN_TOLD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    wait_for_zombie(child)
    return parent, child
