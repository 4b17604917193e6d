"""The first program inside a replica's fresh namespaces: loopback up, bind mounts, then exec.

Run as a script under `unshare --net --pid --fork --mount-proc` (which gives it a network
namespace whose loopback is down, and a private mount namespace):
`python -E -s -S _ns_child.py [--bind SOURCE:TARGET]... -- PROGRAM ARGS...`. A fresh network
namespace's loopback has no 127.0.0.1 until it is up, and CRIU binds the image's loopback
sockets (and connects its established loopback connections again) there. A bind mount shows
the replica's own copy of a directory at the path its processes' environment names; the mount
namespace is private (unshare's default propagation), so nothing of it reaches the host.
Standard library only, so it starts in milliseconds; ctypes and ioctl rather than `ip` and
`mount`, which a minimal image may lack.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import sys

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_MS_BIND = 4096


def loopback_up() -> None:
    """Sets `lo` up (SIOCSIFFLAGS): the kernel then gives it 127.0.0.1 and ::1."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def bind_mount(source: str, target: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), target.encode(), None, _MS_BIND, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount --bind {source} {target}: {os.strerror(err)}")


def main(argv: list[str]) -> int:
    binds: list[tuple[str, str]] = []
    while argv and argv[0] != "--":
        flag = argv.pop(0)
        if flag == "--bind" and argv and ":" in argv[0]:
            source, target = argv.pop(0).split(":", 1)
            binds.append((source, target))
        else:
            print(f"namespaces: unknown or incomplete flag {flag!r}", file=sys.stderr)
            return 2
    if len(argv) < 2:
        print("namespaces: nothing to run after '--'", file=sys.stderr)
        return 2
    try:
        loopback_up()
        for source, target in binds:
            bind_mount(source, target)
    except OSError as exc:
        print(f"namespaces: {exc}", file=sys.stderr)
        return 126
    program = argv[1:]
    try:
        os.execvp(program[0], program)
    except OSError as exc:
        print(f"namespaces: cannot run {program[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
