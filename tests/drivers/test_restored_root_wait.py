"""A restore whose orchestrator was killed while CRIU ran: the search for its unjournaled root
waits for that CRIU restore to end (CRIU writes the pidfile only then), so the root is found and
can be stopped instead of being left running."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

from coldsnap.backends import RESTORED_PIDFILE
from coldsnap.drivers._processes import RESTORE_WORK, restored_root

# Stands in for `criu restore ... --pidfile PIDFILE`: after a while it starts the "restored"
# process, writes its PID to the pidfile and exits, as a detached CRIU restore does.
_FAKE_CRIU = textwrap.dedent(
    """
    import subprocess, sys, time
    time.sleep(1.0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    open(sys.argv[-1], "w").write(str(child.pid))
    """
)


def test_a_restore_still_running_is_waited_for_and_its_root_found(tmp_path: Path) -> None:
    work = tmp_path / RESTORE_WORK
    work.mkdir()
    pidfile = (work / RESTORED_PIDFILE).resolve()
    fake = subprocess.Popen(
        [sys.executable, "-c", _FAKE_CRIU, "restore", "--pidfile", str(pidfile)]
    )
    root = None
    try:
        root = restored_root(tmp_path, lambda proc: True)
        assert root is not None, "the root CRIU was still restoring was missed"
        assert root == int(pidfile.read_text())
        assert fake.wait(timeout=10) == 0
    finally:
        fake.kill()
        fake.wait()
        if root is not None:
            psutil.Process(root).kill()


def test_without_a_restore_running_a_missing_pidfile_is_no_root(tmp_path: Path) -> None:
    (tmp_path / RESTORE_WORK).mkdir()
    assert restored_root(tmp_path, lambda proc: True) is None
