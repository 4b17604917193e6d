"""`wait_gone` and a process that ended as another process's child: only that parent can free
its PID, so waiting longer frees nothing. `coldsnap stop`, run from another process than the
one that restored the engine, finds the engine's root such a zombie."""

from __future__ import annotations

import pytest

from coldsnap.backends import PidStillHeld, wait_gone
from coldsnap.backends.procs import pid_exists

from .conftest import neglectful_parent


def test_a_zombie_of_another_parent_is_left_to_it_and_a_live_process_is_not() -> None:
    parent, zombie = neglectful_parent()
    try:
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
