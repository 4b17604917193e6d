"""n610 honours a restore request's `replica` (a PID namespace of its own), finds the host PIDs
of processes named by their PIDs inside a restored tree's namespace, and names the image's TCP
connections that a replica could not take again on this host."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from coldsnap.drivers._errors import DriverError
from coldsnap.drivers.n610 import build
from coldsnap.drivers.n610._driver import held_connections, host_pids, other_pid_namespace
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


def test_a_connection_of_the_image_held_on_this_host_is_named(tmp_path: Path) -> None:
    """A replica shares the host's network: CRIU cannot connect an image's established TCP
    connection again while a running restore of it holds that connection's local end."""
    from tests.backends.test_inet import _image, _inet_entry

    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        try:
            port = client.getsockname()[1]
            free = _free_port()
            images = _image(
                tmp_path,
                _inet_entry(port, state=1),  # established, held here now
                _inet_entry(free, state=1),  # established, held by nothing here
                _inet_entry(port, state=10),  # a listener: rebound, not connected again
            )
            assert held_connections(images) == [f"127.0.0.1:{port}"]
        finally:
            accepted.close()
            client.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
