"""What a replica's namespaces are made of, with real namespaces and no CRIU: the helper that
brings a fresh network namespace's loopback up and bind-mounts a replica's own dir, the
forwarder that serves the host's port from inside, and the PIDs of a tree in a PID namespace of
its own mapped to this host's."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coldsnap.backends import forward
from coldsnap.backends.criu import _NS_CHILD
from coldsnap.backends.inet import PortInUse
from coldsnap.backends.procs import host_pid, namespace_pid, tree_pids
from tests._support import free_port, need

pytestmark = [pytest.mark.criu, pytest.mark.xdist_group("toys")]

# Inside the namespaces: write what this process sees at TARGET, then serve an echo with a
# prefix on 127.0.0.1:PORT (the namespace's own loopback, up only if the helper set it up).
_INNER = """
import socket, sys
port, target = int(sys.argv[1]), sys.argv[2]
open(sys.argv[3], "w").write(open(target + "/seen").read())
with socket.create_server(("127.0.0.1", port)) as server:
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            data = conn.recv(1024)
            conn.sendall(b"inner:" + data)
"""


@pytest.fixture
def namespaced(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """(unshare, the inner server's host PID, the dir it read) for a server in fresh network,
    PID and mount namespaces, started through the replica helper with a bind mount."""
    need("criu")  # root, as CRIU: namespaces need it too
    own, shared = tmp_path / "own", tmp_path / "shared"
    own.mkdir()
    shared.mkdir()
    (own / "seen").write_text("the replica's own")
    (shared / "seen").write_text("the host's")
    inner = [sys.executable, "-c", _INNER, "41000", str(shared), str(tmp_path / "read")]
    unshare = shutil.which("unshare")
    assert unshare is not None
    popen = subprocess.Popen(
        [unshare, "--pid", "--net", "--fork", "--mount-proc", sys.executable, "-E", "-s",
         "-S", str(_NS_CHILD), "--bind", f"{own}:{shared}", "--", *inner],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    root = None
    try:
        assert popen.stdout is not None and popen.stdout.readline() == b"ready\n"
        root = next(p for p in tree_pids(popen.pid)[1:] if namespace_pid(p) == 1)
        yield popen, root, tmp_path
    finally:
        if root is not None and os.path.exists(f"/proc/{root}"):
            os.kill(root, signal.SIGKILL)  # the namespace's init: the rest ends with it
        popen.kill()
        popen.wait()


def test_the_helper_sets_loopback_up_and_shows_the_replica_its_own_dir(namespaced) -> None:
    _, root, tmp_path = namespaced
    assert (tmp_path / "read").read_text() == "the replica's own"
    assert (tmp_path / "shared" / "seen").read_text() == "the host's"  # nothing reached here
    assert os.readlink(f"/proc/{root}/ns/net") != os.readlink("/proc/self/ns/net")


def test_the_forwarder_serves_the_host_port_and_ends_with_the_namespace(namespaced) -> None:
    popen, root, tmp_path = namespaced
    port = free_port()
    listener = forward.listen("127.0.0.1", port)
    with pytest.raises(PortInUse, match=str(port)):
        forward.listen("127.0.0.1", port)
    nsenter = forward.start(listener, root, 41000, tmp_path / "forward.log")
    listener.close()
    for word in (b"one", b"two"):  # each connection on its own
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(word)
            assert conn.recv(1024) == b"inner:" + word
    forwarder = tree_pids(nsenter)[1]
    assert os.readlink(f"/proc/{forwarder}/ns/pid") == os.readlink(f"/proc/{root}/ns/pid")
    os.kill(root, signal.SIGKILL)  # the namespace's init: the kernel ends the rest with it
    popen.wait(10)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{forwarder}") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not os.path.exists(f"/proc/{forwarder}"), "the forwarder outlived its namespace"
    forward.listen("127.0.0.1", port).close()  # the port is free again


def test_pids_inside_a_namespace_map_to_this_host(namespaced) -> None:
    _, root, _ = namespaced
    assert host_pid(root, 1) == root
    assert host_pid(root, 2**22 + 1) == 2**22 + 1  # none of its tree: left as asked
    assert host_pid(os.getpid(), os.getppid()) == os.getppid()  # same namespace: as it is
