"""n610 honours a restore request's `replica` (a PID namespace of its own), and finds the host
PIDs of processes named by their PIDs inside a restored tree's namespace."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coldsnap.drivers._errors import DriverError
from coldsnap.drivers.n610 import build
from coldsnap.drivers.n610._driver import host_pids, other_pid_namespace
from coldsnap.machine import RestoreRequest


class _Engine:
    launcher = object()


@pytest.mark.parametrize("replica", [False, True])
def test_the_driver_restores_into_a_new_namespace_only_for_a_replica(
    tmp_path: Path, replica: bool
) -> None:
    request = RestoreRequest(driver="n610", provider="native", artifact="tiny", replica=replica,
                             workdir=str(tmp_path / "op"),
                             store=str(tmp_path / "store"))  # fmt: skip
    assert build(request, _Engine()).restore_pid_namespace is replica  # type: ignore[arg-type]


def test_host_pids_map_a_tree_s_namespace_pids_and_name_the_missing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # In this namespace a process's innermost PID is its host PID.
        assert host_pids(os.getpid(), [child.pid, os.getpid()]) == [child.pid, os.getpid()]
        with pytest.raises(DriverError, match=str(2**22 + 1)):
            host_pids(os.getpid(), [2**22 + 1])
    finally:
        child.kill()
        child.wait()
    assert not other_pid_namespace(os.getpid())
