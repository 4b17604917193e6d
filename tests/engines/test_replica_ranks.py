"""The ranks of an engine restored into a PID namespace of its own (a replica) are checked by the
PIDs its records and its capsule hold, which are the ones its processes see there: they are
mapped to this host's through the engine's tree, and a PID that no process of the tree has
there is still named."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from coldsnap.backends.procs import namespace_pid, tree_pids
from coldsnap.engines.sglang._ranks import absent_ranks
from tests._support import need

pytestmark = [pytest.mark.criu, pytest.mark.xdist_group("toys")]

# The namespace's init starts one child (a "rank") and waits; both sleep until killed.
_TREE = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', " \
        "'import time; time.sleep(300)']); print('ready', flush=True); time.sleep(300)"


def test_a_rank_in_the_engine_s_own_pid_namespace_is_found_by_its_pid_there() -> None:
    need("criu")  # root, as CRIU: a PID namespace needs it too
    unshare = shutil.which("unshare")
    assert unshare is not None
    popen = subprocess.Popen([unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                              _TREE], stdout=subprocess.PIPE)  # fmt: skip
    root = None
    try:
        assert popen.stdout is not None and popen.stdout.readline() == b"ready\n"
        root = next(p for p in tree_pids(popen.pid)[1:] if namespace_pid(p) == 1)
        deadline = time.monotonic() + 10
        while len(tree_pids(root)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        rank = tree_pids(root)[1]
        inside = namespace_pid(rank)
        assert inside is not None and inside != rank  # what the rank's record would say
        assert absent_ranks(root, {"scheduler-tp0": inside}, 1) == []
        lines = absent_ranks(root, {"scheduler-tp0": 2**22 + 1}, 1)
        assert len(lines) == 1 and str(2**22 + 1) in lines[0]
    finally:
        if root is not None and os.path.exists(f"/proc/{root}"):
            os.kill(root, signal.SIGKILL)  # the namespace's init: the rest ends with it
        popen.kill()
        popen.wait()
