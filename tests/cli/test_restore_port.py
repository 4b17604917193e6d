"""Restores serve where they are told: n610 moves the image's listening socket to the request's
port (coldsnap.drivers.n610.serve_on), n580 builds its engine with the request's --port."""

from __future__ import annotations

import shutil
import socket
import struct
from pathlib import Path

import pytest

from coldsnap.backends.inet import FILES_IMAGE, PortInUse, join_image, listeners
from coldsnap.drivers.n610._driver import serve_on
from coldsnap.engines.sglang import SGLangLauncher
from coldsnap.machine import ModelRef, RestoreRequest, WeightSource
from tests._support import free_port

from ..backends.test_inet import MAGIC, _inet_entry

_PAYLOAD = WeightSource(source="payload", payload_dir="/capsule/payload")


@pytest.fixture
def images(tmp_path: Path) -> Path:
    folder = tmp_path / "image"
    folder.mkdir()
    (folder / FILES_IMAGE).write_bytes(join_image(MAGIC, [_inet_entry(40000)]))
    return folder


def test_without_a_port_the_captured_url_stands_and_the_image_is_untouched(images) -> None:
    before = (images / FILES_IMAGE).read_bytes()
    assert serve_on(images, "http://127.0.0.1:40000", None) == "http://127.0.0.1:40000"
    assert serve_on(images, "http://127.0.0.1:40000", 40000) == "http://127.0.0.1:40000"
    assert (images / FILES_IMAGE).read_bytes() == before


def test_a_port_moves_the_listener_and_the_url(images: Path) -> None:
    port = free_port()
    assert serve_on(images, "http://127.0.0.1:40000", port) == f"http://127.0.0.1:{port}"
    assert [x.port for x in listeners(images)] == [port]


def test_a_port_in_use_is_refused_before_the_image_changes(images: Path) -> None:
    before = (images / FILES_IMAGE).read_bytes()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(PortInUse):
            serve_on(images, "http://127.0.0.1:40000", busy.getsockname()[1])
    assert (images / FILES_IMAGE).read_bytes() == before
    assert struct.unpack_from("<I", before, 4)[0] == 0x56303138


def test_n580_builds_its_engine_on_the_request_s_port(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    request = RestoreRequest(
        driver="n580", provider="native", artifact="tiny", workdir=str(tmp_path / "op"),
        store=str(tmp_path / "store"), port=31234,
        model=ModelRef(id="tiny", revision="r1", path=str(tmp_path / "model")),
    )  # fmt: skip
    command = SGLangLauncher().command(request, tmp_path / "op", weights=_PAYLOAD)
    try:
        assert command.url == "http://127.0.0.1:31234"
        at = command.argv.index("--port")
        assert command.argv[at + 1] == "31234" and command.argv.count("--port") == 1
    finally:
        shutil.rmtree(command.env["COLDSNAP_RUNTIME_DIR"], ignore_errors=True)
