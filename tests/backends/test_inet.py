"""coldsnap.backends.inet: the protobuf wire format it reads and writes, and, on a real CRIU dump
of a process listening on a port, that a rebound image restores listening on the new port only,
while the file the image's hard link shares (the store's object) is left as it was."""

from __future__ import annotations

import os
import shutil
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from coldsnap.backends import Criu, RestoredTree, launch, wait_gone
from coldsnap.backends.inet import (
    FILES_IMAGE,
    ImageEditError,
    PortInUse,
    check_port_free,
    decode_message,
    encode_message,
    encode_varint,
    join_image,
    listeners,
    rebind,
    split_image,
)
from tests._support import free_port

from .conftest import target, wait_for_line

pytestmark = pytest.mark.xdist_group("toys")

MAGIC = struct.pack("<II", 0x54564319, 0x56303138)


# -- the wire format ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16383, 16384, 65535, 2**32 - 1, 2**64 - 1])
def test_varints_round_trip(value: int) -> None:
    data = encode_message([(7, 0, value)])
    assert decode_message(data) == [(7, 0, value)]
    assert len(encode_varint(value)) == max(1, -(-value.bit_length() // 7))


def test_messages_keep_every_field_in_order() -> None:
    fields = [
        (1, 0, 4),
        (2, 0, 9),
        (4, 2, b"\x08\x02\x38\xb0\xea\x01"),
        (9, 5, b"\x01\x02\x03\x04"),
    ]
    fields.append((10, 1, b"12345678"))
    data = encode_message(fields)
    assert decode_message(data) == fields
    assert encode_message(decode_message(data)) == data


@pytest.mark.parametrize(
    "data", [b"\x08", b"\x12\x05ab", b"\x0b", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"]
)
def test_malformed_messages_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_message(data)


def _inet_entry(port: int, *, state: int = 10, family: int = 2, addr: int = 0x0100007F) -> bytes:
    isk = [(1, 0, 5), (2, 0, 77), (3, 0, family), (4, 0, 1), (5, 0, 6), (6, 0, state)]
    isk += [(7, 0, port), (8, 0, 0), (9, 0, 2048), (10, 0, 128), (11, 0, addr), (13, 2, b"")]
    return encode_message([(1, 0, 4), (2, 0, 5), (4, 2, encode_message(isk))])


def _image(tmp_path: Path, *entries: bytes) -> Path:
    images = tmp_path / "image"
    images.mkdir(exist_ok=True)
    (images / FILES_IMAGE).write_bytes(join_image(MAGIC, list(entries)))
    return images


REG = encode_message([(1, 0, 1), (2, 0, 1), (3, 2, b"\x08\x01\x32\x04/bin")])


def test_rebind_changes_only_the_listener_on_the_old_port(tmp_path: Path) -> None:
    established = _inet_entry(40000, state=1)
    images = _image(tmp_path, REG, _inet_entry(40000), established, _inet_entry(29500))
    before = (images / FILES_IMAGE).read_bytes()
    assert [(x.address, x.port) for x in listeners(images)] == [
        ("127.0.0.1", 40000),
        ("127.0.0.1", 29500),
    ]
    moved = rebind(images, old_port=40000, port=300)  # 3-byte varint to 2 bytes: lengths change
    assert (moved.address, moved.port) == ("127.0.0.1", 300)
    magic, entries = split_image((images / FILES_IMAGE).read_bytes())
    _, old = split_image(before)
    assert magic == MAGIC
    assert entries[0] == REG and entries[2] == established and entries[3] == old[3]
    assert entries[1] != old[1] and len(entries[1]) == len(old[1]) - 1
    assert [x.port for x in listeners(images)] == [300, 29500]


def test_rebind_sets_an_ipv4_host_and_is_idempotent(tmp_path: Path) -> None:
    images = _image(tmp_path, _inet_entry(40000))
    assert rebind(images, old_port=40000, port=41000, host="0.0.0.0").address == "0.0.0.0"
    once = (images / FILES_IMAGE).read_bytes()
    assert rebind(images, old_port=40000, port=41000, host="0.0.0.0").port == 41000
    assert (images / FILES_IMAGE).read_bytes() == once
    with pytest.raises(ImageEditError, match="only an IPv4"):
        rebind(images, old_port=41000, port=42000, host="::1")


def test_rebind_without_a_listener_there_names_what_the_image_has(tmp_path: Path) -> None:
    images = _image(tmp_path, REG, _inet_entry(40000))
    with pytest.raises(
        ImageEditError, match=r"no listening TCP socket on port 1234 .*127\.0\.0\.1:40000"
    ):
        rebind(images, old_port=1234, port=2345)


def test_a_damaged_image_is_refused_naming_the_file(tmp_path: Path) -> None:
    images = tmp_path / "image"
    images.mkdir()
    (images / FILES_IMAGE).write_bytes(MAGIC + struct.pack("<I", 99) + b"short")
    with pytest.raises(ImageEditError, match=r"files\.img: not a CRIU image"):
        listeners(images)
    with pytest.raises(ImageEditError, match="cannot read"):
        listeners(tmp_path)


def test_a_port_in_use_is_named() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(PortInUse, match=f"port {port} on 127.0.0.1 is in use"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)


# -- a real dump --------------------------------------------------------------------------------


@pytest.fixture
def restored(criu: Criu) -> Iterator[list[RestoredTree]]:
    trees: list[RestoredTree] = []
    yield trees
    for tree in reversed(trees):
        criu.stop(tree, timeout=5)
        if tree.criu_pid is None:
            wait_gone(tree.pid, timeout=10)


@pytest.mark.criu
def test_a_rebound_image_restores_listening_on_the_new_port(
    criu: Criu, tmp_path: Path, restored: list[RestoredTree]
) -> None:
    port, new = free_port(), free_port()
    proc = launch(target("http_server.py", port), log_path=tmp_path / "http.log")
    try:
        wait_for_line(tmp_path / "http.log", "ready")
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).text.startswith("hits=1 ")
        criu.dump(proc.pid, tmp_path / "dumped")
    finally:
        proc.stop(timeout=5)
    # Laid out as admission does: hard links to the files another directory (the store) holds.
    images = tmp_path / "image"
    images.mkdir()
    for item in (tmp_path / "dumped").iterdir():
        os.link(item, images / item.name)
    stored = (tmp_path / "dumped" / FILES_IMAGE).read_bytes()
    assert [(x.address, x.port) for x in listeners(images)] == [("127.0.0.1", port)]

    rebind(images, old_port=port, port=new)

    assert (tmp_path / "dumped" / FILES_IMAGE).read_bytes() == stored, "the store's file changed"
    assert [x.port for x in listeners(images)] == [new]
    restored.append(criu.restore(images))
    assert httpx.get(f"http://127.0.0.1:{new}/", timeout=10).text.startswith("hits=2 ")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
    shutil.rmtree(tmp_path / "dumped")
