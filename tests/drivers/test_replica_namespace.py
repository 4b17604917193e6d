"""n610 honours a restore request's `replica` (PID and network namespaces of its own), finds the
host PIDs of processes named by their PIDs inside a restored tree's namespace, serves a replica
on the host's port the request names while its image listens on that port inside, and gives
each replica a runtime dir of its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from coldsnap.backends.inet import listeners
from coldsnap.drivers._errors import DriverError
from coldsnap.drivers._processes import HOST_ROOT
from coldsnap.drivers.n610 import build
from coldsnap.drivers.n610._driver import (
    host_pids,
    other_pid_namespace,
    replica_dir,
    serve_replica_on,
)
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


def test_a_replica_serves_on_the_host_where_asked_and_on_the_loopback_inside(
    tmp_path: Path,
) -> None:
    from tests.backends.test_inet import _image, _inet_entry

    wildcard = _inet_entry(40000, addr=0)  # captured with --host 0.0.0.0
    images = _image(tmp_path, wildcard, _inet_entry(29500))
    port = _free_port()
    url, host, served = serve_replica_on(images, "http://127.0.0.1:40000", port)
    # The forwarder listens where the image did; the engine, inside, on its loopback.
    assert (url, host, served) == (f"http://127.0.0.1:{port}", "0.0.0.0", port)
    assert [(x.address, x.port) for x in listeners(images)] == [
        ("127.0.0.1", port),
        ("127.0.0.1", 29500),
    ]
    again = serve_replica_on(images, "http://127.0.0.1:40000", port, "127.0.0.1")
    assert again == (f"http://127.0.0.1:{port}", "127.0.0.1", port)  # a retry: as it is


def test_a_replica_s_port_in_use_is_refused_before_the_image_changes(tmp_path: Path) -> None:
    from coldsnap.backends.inet import PortInUse
    from tests.backends.test_inet import _image, _inet_entry

    images = _image(tmp_path, _inet_entry(40000))
    with (
        socket.create_server(("127.0.0.1", 0)) as busy,
        pytest.raises(PortInUse, match=str(busy.getsockname()[1])),
    ):
        serve_replica_on(images, "http://127.0.0.1:40000", busy.getsockname()[1])
    assert [x.port for x in listeners(images)] == [40000]


def test_each_replica_gets_a_runtime_dir_of_its_own_beside_the_capsule_s() -> None:
    capsule_dir = str(HOST_ROOT / "engine-abc")
    first, second = replica_dir(capsule_dir), replica_dir(capsule_dir)
    assert first != second
    for own in (first, second):
        assert own.startswith(capsule_dir + ".replica-")
        assert Path(own).parent == HOST_ROOT


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
