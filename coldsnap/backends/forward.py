"""Serving a port of the host from a process tree in a network namespace of its own.

A tree restored into a fresh network namespace (Criu.restore's `new_net_namespace`) listens on
that namespace's loopback, which nothing on the host reaches. Measured here: no iptables or
nft binary to NAT into it, and CRIU cannot take an inet socket from the caller
(`--inherit-fd` covers files, pipes and unix sockets). So a forwarder carries each
connection: its listening socket is made on the host's network, here, before it starts (a
port that is taken is refused at once, and connections made meanwhile wait in the backlog);
it runs inside the tree's namespaces (`nsenter`) and connects to the port on their loopback.
Being in the tree's PID namespace, it ends with it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from ._errors import LaunchError
from .inet import PortInUse

_CHILD = Path(__file__).with_name("_forward_child.py")


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on host:port (IPv4, SO_REUSEADDR as an engine's own); PortInUse
    when it cannot bind."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1" if host == "localhost" else host, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise PortInUse(f"port {port} on {host} is in use ({exc.strerror})") from None
    return sock


def start(listener: socket.socket, target_pid: int, port: int, log_path: Path) -> int:
    """Starts a forwarder from `listener` (made by `listen`) to 127.0.0.1:`port` in the network
    and PID namespaces of `target_pid`; returns the PID of its `nsenter`, which waits for it.
    The caller may close its copy of `listener` once this returns."""
    nsenter = shutil.which("nsenter")
    if nsenter is None:
        raise LaunchError("forward: a replica's port needs util-linux's `nsenter`")
    fd = listener.fileno()
    argv = [nsenter, f"--target={target_pid}", "--net", "--pid", "--",
            sys.executable, "-E", "-s", "-S", str(_CHILD), str(fd), str(port)]  # fmt: skip
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(fd,),
            start_new_session=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
    return popen.pid


__all__ = ["listen", "start"]
