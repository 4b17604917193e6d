"""CRIU's image format, without CRIU's Python tools: the few facts coldsnap reads from an image
directory, and the lossless wire-format reader and writer that coldsnap.backends.inet edits
files.img with.

pycriu/crit are not on PyPI, and we only need a few things: the PIDs an image will take back
(pstree.img, to detect a collision before CRIU fails on it), the file paths it references
(files.img, to keep the /dev/shm files it needs; _stdio: the tree's stdout and stderr) and its
listening sockets (inet). Protobuf field numbers never change, so a small wire-format codec is
enough. Image layout: two little-endian u32 magics, then entries, each a u32 size and a
protobuf message.

Standard library only: CRIU's post-dump hook runs it with `python -S` (see _files).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

if __package__:
    from ._errors import BackendError as _Base
else:  # run by CRIU's post-dump hook (through _files) as a plain script: stdlib only
    _Base = Exception  # type: ignore[assignment,misc]

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class ImageFormatError(ValueError, _Base):
    """An image file is not what CRIU writes. A BackendError, and a ValueError as it was."""


class TaskIds(NamedTuple):
    """One task of a dumped tree, with the PIDs as the image records them."""

    pid: int
    ppid: int
    threads: tuple[int, ...]


Field = tuple[int, int, int | bytes]
"""One field of a message as it is on the wire: number, wire type, value (an int for a varint,
the raw bytes otherwise, fixed-width fields included, so that a message re-encodes as read)."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ImageFormatError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ImageFormatError("varint too long")


def _fields(msg: bytes) -> Iterator[Field]:
    """Yields (field number, wire type, value) of one protobuf message, in wire order."""
    pos = 0
    while pos < len(msg):
        key, pos = _varint(msg, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(msg, pos)
            yield number, wire, value
            continue
        if wire == _LEN:
            size, pos = _varint(msg, pos)
        elif wire in (_I64, _I32):
            size = 8 if wire == _I64 else 4
        else:
            raise ImageFormatError(f"field {number}: unsupported wire type {wire}")
        if pos + size > len(msg):
            raise ImageFormatError(f"field {number}: truncated")
        yield number, wire, msg[pos : pos + size]
        pos += size


def decode_message(msg: bytes) -> list[Field]:
    """Every field of one message, in wire order (`encode_message` gives the bytes back)."""
    return list(_fields(msg))


def encode_varint(value: int) -> bytes:
    if value < 0:
        raise ImageFormatError(f"a varint is unsigned, got {value}")
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_message(fields: list[Field]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += encode_varint(number << 3 | wire)
        if wire == _VARINT:
            out += encode_varint(int(value))  # type: ignore[arg-type]
        elif isinstance(value, bytes):
            out += (encode_varint(len(value)) if wire == _LEN else b"") + value
        else:
            raise ImageFormatError(f"field {number}: wire type {wire} needs bytes, got {value!r}")
    return bytes(out)


def split_image(data: bytes) -> tuple[bytes, list[bytes]]:
    """An image file's magic words and its entries (each a serialized message)."""
    if len(data) < 8:
        raise ImageFormatError("too short for a CRIU image")
    entries, pos = [], 8
    while pos < len(data):
        if pos + 4 > len(data):
            raise ImageFormatError(f"truncated entry size at byte {pos}")
        (size,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if pos + size > len(data):
            raise ImageFormatError(f"truncated entry: the one at byte {pos - 4} runs past the end")
        entries.append(data[pos : pos + size])
        pos += size
    return data[:8], entries


def join_image(magic: bytes, entries: list[bytes]) -> bytes:
    return magic + b"".join(struct.pack("<I", len(e)) + e for e in entries)


def _entries(path: Path) -> Iterator[bytes]:
    try:
        _, entries = split_image(path.read_bytes())
    except ImageFormatError as exc:
        raise ImageFormatError(f"{path}: {exc}") from None
    yield from entries


def read_pstree(images_dir: Path) -> tuple[TaskIds, ...]:
    """The tasks of the dumped tree (pstree.img), root first."""
    tasks = []
    for entry in _entries(images_dir / "pstree.img"):
        pid = ppid = 0
        threads: list[int] = []
        for number, wire, value in _fields(entry):
            if number == 1 and wire == _VARINT:
                pid = int(value)  # type: ignore[arg-type]
            elif number == 2 and wire == _VARINT:
                ppid = int(value)  # type: ignore[arg-type]
            elif number == 5 and wire == _VARINT:
                threads.append(int(value))  # type: ignore[arg-type]
            elif number == 5 and wire == _LEN:  # packed repeated
                buf, pos = bytes(value), 0  # type: ignore[arg-type]
                while pos < len(buf):
                    tid, pos = _varint(buf, pos)
                    threads.append(tid)
        tasks.append(TaskIds(pid=pid, ppid=ppid, threads=tuple(threads)))
    if not tasks:
        raise ImageFormatError(f"{images_dir / 'pstree.img'}: no tasks")
    return tuple(tasks)


def read_file_paths(images_dir: Path) -> tuple[str, ...]:
    """The paths of the regular files the image references (files.img), in image order."""
    paths: list[str] = []
    files_img = images_dir / "files.img"
    if not files_img.exists():
        return ()
    for entry in _entries(files_img):
        for number, wire, value in _fields(entry):
            if number == 3 and wire == _LEN:  # file_entry.reg
                for sub_number, sub_wire, sub_value in _fields(bytes(value)):  # type: ignore[arg-type]
                    if sub_number == 6 and sub_wire == _LEN:  # reg_file_entry.name
                        name = bytes(sub_value).decode("utf-8", "surrogateescape")  # type: ignore[arg-type]
                        if name not in paths:
                            paths.append(name)
    return tuple(paths)
