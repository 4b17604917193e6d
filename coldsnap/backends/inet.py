"""Rebinding the listening TCP sockets of a CRIU image to another port (and IPv4 address).

CRIU keeps every open file of a dumped tree in `files.img`: two magic words, then entries, each
a little-endian u32 length and a `FileEntry` protobuf (images/fdinfo.proto). An inet socket is
an entry of type INETSK whose `isk` (`InetSkEntry`, images/sk-inet.proto) holds its family,
state, `src_port` and `src_addr`. CRIU restores a listening socket by binding a new socket to
those and listening on it, so a restored process listens wherever the image says: edit the
entry before `criu restore` and it listens on the new port. Nothing else in an image names it.

pycriu and crit are not installed where coldsnap runs, and only four fields matter, so this
module edits the entry with coldsnap's own wire-format codec (_images) and keeps every byte of
every entry it does not change. A changed `files.img` is written as a new file and renamed over
the old name: a laid-out image is hard links to the store's objects, which must never change.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

from attrs import frozen

from coldsnap._atomic import write_bytes_atomic

from ._errors import BackendError
from ._images import (
    _LEN,
    _VARINT,
    Field,
    _varint,
    decode_message,
    encode_message,
    encode_varint,
    join_image,
    split_image,
)

FILES_IMAGE = "files.img"

# images/fdinfo.proto: FileEntry {type = 1; id = 2; isk = 4}; fd_types.INETSK = 4
_FILE_TYPE, _FILE_ISK, _INETSK = 1, 4, 4
# images/sk-inet.proto: InetSkEntry {family = 3; type = 4; proto = 5; state = 6;
# src_port = 7; dst_port = 8; src_addr = 11 (repeated u32, the address's bytes as CRIU's memory
# holds them)}; TCP states as Linux numbers them
_ISK_FAMILY, _ISK_TYPE, _ISK_STATE, _ISK_SRC_PORT, _ISK_SRC_ADDR = 3, 4, 6, 7, 11
_ISK_DST_PORT = 8
_TCP_LISTEN, _TCP_ESTABLISHED = 10, 1


class ImageEditError(BackendError):
    """A process image could not be read or edited as asked; the message names the file."""


class PortInUse(BackendError):
    """Something listens on the address a restored engine must listen on."""


def check_port_free(host: str, port: int) -> None:
    """PortInUse unless a TCP socket can bind `host:port` now (with SO_REUSEADDR, as the
    engine's own socket has, so a port left in TIME_WAIT by a stopped engine counts as free):
    a restore that would fail in CRIU's bind says so before it starts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((_norm(host), port))
        except OSError as exc:
            raise PortInUse(f"port {port} on {host} is in use ({exc.strerror})") from None


@frozen
class Listener:
    """A listening TCP socket of an image."""

    family: int
    address: str
    port: int


def _first(fields: list[Field], number: int) -> int | bytes | None:
    return next((value for n, _, value in fields if n == number), None)


def _ints(fields: list[Field], number: int) -> list[int]:
    """A repeated u32 field, packed or not."""
    out: list[int] = []
    for n, wire, value in fields:
        if n != number:
            continue
        if wire == _VARINT:
            out.append(int(value))  # type: ignore[arg-type]
        elif isinstance(value, bytes):  # packed
            pos = 0
            while pos < len(value):
                item, pos = _varint(value, pos)
                out.append(item)
    return out


# -- files.img ----------------------------------------------------------------------------------


def _address(family: int, words: list[int]) -> str:
    raw = b"".join(struct.pack("<I", w) for w in words)
    if family == socket.AF_INET and len(raw) >= 4:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    if family == socket.AF_INET6 and len(raw) >= 16:
        return socket.inet_ntop(socket.AF_INET6, raw[:16])
    return "?"


def _listening(isk: list[Field]) -> Listener | None:
    family, kind = _first(isk, _ISK_FAMILY), _first(isk, _ISK_TYPE)
    if family not in (socket.AF_INET, socket.AF_INET6) or kind != socket.SOCK_STREAM:
        return None
    if _first(isk, _ISK_STATE) != _TCP_LISTEN:
        return None
    port = _first(isk, _ISK_SRC_PORT)
    return Listener(int(family), _address(int(family), _ints(isk, _ISK_SRC_ADDR)), int(port or 0))


def _sockets(entries: list[bytes]) -> Iterator[tuple[int, list[Field], int, list[Field]]]:
    """(index, FileEntry fields, index of its isk field, InetSkEntry fields) of each inet
    socket."""
    for index, entry in enumerate(entries):
        fields = decode_message(entry)
        if _first(fields, _FILE_TYPE) != _INETSK:
            continue
        for at, (number, wire, value) in enumerate(fields):
            if number == _FILE_ISK and wire == _LEN and isinstance(value, bytes):
                yield index, fields, at, decode_message(value)


def _read(images: Path) -> tuple[Path, bytes, list[bytes]]:
    path = images / FILES_IMAGE
    try:
        magic, entries = split_image(path.read_bytes())
    except OSError as exc:
        raise ImageEditError(f"{path}: cannot read the image's files: {exc.strerror}") from None
    except ValueError as exc:
        raise ImageEditError(f"{path}: not a CRIU image: {exc}") from None
    return path, magic, entries


def listeners(images: Path) -> tuple[Listener, ...]:
    """The listening TCP sockets in the image under `images`."""
    path, _, entries = _read(images)
    try:
        found = [_listening(isk) for *_, isk in _sockets(entries)]
    except ValueError as exc:
        raise ImageEditError(f"{path}: an inet socket entry is not protobuf: {exc}") from None
    return tuple(f for f in found if f is not None)


@frozen
class Connection:
    """An established TCP connection of an image, by its local end (what a second restore of
    the image on this host's network would have to take again)."""

    family: int
    address: str
    port: int
    peer_port: int


def established(images: Path) -> tuple[Connection, ...]:
    """The established TCP connections in the image under `images`. CRIU restores each by
    binding its local address and port and connecting to its peer again, which fails while
    another socket on this network holds that connection (a restore of the same image)."""
    path, _, entries = _read(images)
    found = []
    try:
        for *_, isk in _sockets(entries):
            family, kind = _first(isk, _ISK_FAMILY), _first(isk, _ISK_TYPE)
            if family not in (socket.AF_INET, socket.AF_INET6) or kind != socket.SOCK_STREAM:
                continue
            if _first(isk, _ISK_STATE) != _TCP_ESTABLISHED:
                continue
            address = _address(int(family), _ints(isk, _ISK_SRC_ADDR))
            port, peer = _first(isk, _ISK_SRC_PORT), _first(isk, _ISK_DST_PORT)
            found.append(Connection(int(family), address, int(port or 0), int(peer or 0)))
    except ValueError as exc:
        raise ImageEditError(f"{path}: an inet socket entry is not protobuf: {exc}") from None
    return tuple(found)


def _ipv4_words(host: str) -> list[int]:
    try:
        address = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)
    except ValueError:
        raise ImageEditError(f"host {host!r} is not an IP address") from None
    if address.version != 4:
        raise ImageEditError(f"host {host!r}: only an IPv4 address can be set at restore")
    return [struct.unpack("<I", address.packed)[0]]


def rebind(images: Path, *, old_port: int, port: int, host: str | None = None) -> Listener:
    """Makes the image's listening TCP socket on `old_port` listen on `port` (and on `host`, an
    IPv4 address, when given) once restored; returns it as it now is. Idempotent: an image
    already rebound (nothing on `old_port`, a listener on `port`) is left as it is.

    ImageEditError when the image has no listener on `old_port`, or one that is not IPv4 and
    a host is asked; the message lists the listeners it has."""
    path, magic, entries = _read(images)
    words = _ipv4_words(host) if host is not None else None
    changed: Listener | None = None
    try:
        for index, fields, at, isk in _sockets(entries):
            found = _listening(isk)
            if found is None or found.port != old_port:
                continue
            if words is not None and found.family != socket.AF_INET:
                raise ImageEditError(
                    f"{path}: the listener on port {old_port} is IPv6; only an IPv4 host can "
                    "be set at restore"
                )
            isk = [(n, w, port if n == _ISK_SRC_PORT else v) for n, w, v in isk]
            if words is not None:
                at_addr = next(i for i, (n, *_) in enumerate(isk) if n == _ISK_SRC_ADDR)
                isk = [f for f in isk if f[0] != _ISK_SRC_ADDR]
                isk[at_addr:at_addr] = [(_ISK_SRC_ADDR, _VARINT, w) for w in words]
            fields[at] = (_FILE_ISK, _LEN, encode_message(isk))
            entries[index] = encode_message(fields)
            changed = _listening(isk)
    except (ValueError, StopIteration) as exc:
        raise ImageEditError(f"{path}: an inet socket entry is not as expected: {exc}") from None
    if changed is not None:
        write_bytes_atomic(path, join_image(magic, entries))  # a new inode: the store's stays
        return changed
    have = listeners(images)
    done = [f for f in have if f.port == port and (host is None or f.address == _norm(host))]
    if done:
        return done[0]
    names = ", ".join(f"{f.address}:{f.port}" for f in have) or "none"
    raise ImageEditError(
        f"{path}: no listening TCP socket on port {old_port} to move to {port} "
        f"(the image listens on: {names})"
    )


def _norm(host: str) -> str:
    return "127.0.0.1" if host == "localhost" else host


def dial_host(host: str) -> str:
    """The address a client on this host dials to reach a socket bound to `host`: a wildcard
    bind is reached on the loopback."""
    return "127.0.0.1" if _norm(host) in ("0.0.0.0", "") else _norm(host)


__all__ = [
    "FILES_IMAGE",
    "Connection",
    "ImageEditError",
    "Listener",
    "PortInUse",
    "check_port_free",
    "decode_message",
    "dial_host",
    "encode_message",
    "encode_varint",
    "established",
    "join_image",
    "listeners",
    "rebind",
    "split_image",
]
