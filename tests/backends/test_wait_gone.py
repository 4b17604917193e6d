"""`wait_gone` and a process that ended as another process's child: only that parent can free
its PID, so waiting longer frees nothing. `coldsnap stop`, run from a new process, found the
restored engine's root a zombie of the long-running process that restored it and waited its
whole 20 s timeout on every stop."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from coldsnap.backends import PidStillHeld, wait_gone
from coldsnap.backends.procs import pid_exists

# Forks a child that exits at once, never reaps it, prints its PID, then waits for stdin.
_NEGLECTFUL_PARENT = textwrap.dedent(
    """
    import os, sys
    child = os.fork()
    if child == 0:
        os._exit(3)
    print(child, flush=True)
    sys.stdin.read()
    """
)


def test_a_zombie_of_another_parent_is_left_to_it_and_a_live_process_is_not() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _NEGLECTFUL_PARENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        zombie = int(parent.stdout.readline())
        # Ended, not ours to reap: returned without its code, the PID still its parent's.
        assert wait_gone(zombie, timeout=20.0) is None
        assert pid_exists(zombie), "the zombie's PID was freed: nothing was tested"
        # A live process (the parent itself) is still waited for, and named when it outlasts.
        with pytest.raises(PidStillHeld, match=str(parent.pid)):
            wait_gone(parent.pid, timeout=0.2)
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(10)
    assert wait_gone(parent.pid, timeout=10.0) is None  # reaped by Popen.wait: free at once
