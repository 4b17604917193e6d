"""A TCP forwarder from a socket listening on the host to a port inside a network namespace.

Run as a script inside the target's namespaces (`nsenter --target PID --net --pid`) with the
listening socket inherited: `python -E -s -S _forward_child.py LISTEN_FD PORT`. The socket was
bound and put in listen state on the host's network before the exec (a socket stays in the
namespace it was made in), so it accepts there; every connection to 127.0.0.1:PORT is made
here, on the namespace's own loopback. Connections that arrive before this runs wait in the
socket's backlog. It ends with the namespace: the kernel kills every process of a PID
namespace once its init ends. Standard library only, so it starts in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys

_CHUNK = 1 << 16


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # half-close: the other direction may still be answering
    except (ConnectionError, OSError):
        writer.close()


async def _serve(listener: socket.socket, port: int) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            inner_r, inner_w = await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            print(f"forward: cannot reach 127.0.0.1:{port}: {exc}", file=sys.stderr, flush=True)
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, inner_w), _pipe(inner_r, client_w))
        for writer in (client_w, inner_w):
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, sock=listener, backlog=1024)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: _forward_child.py LISTEN_FD PORT", file=sys.stderr)
        return 2
    listener = socket.socket(fileno=int(argv[0]))
    listener.setblocking(False)
    asyncio.run(_serve(listener, int(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
