"""Where a restore listens: the captured launch command line's --port and --host are kept in
the capture record (format 3; format 2 is still read), a restore without --port/--host serves
there, and --host reaches the engine (n610: the image's listener, n580: the engine's --host)."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import attrs
import pytest
from click.testing import CliRunner, Result

from coldsnap.artifacts import Capsule, Member, RecordError, Store, to_json
from coldsnap.backends.inet import listeners
from coldsnap.capsules import RECORD_NAME, CaptureRecord, read_record
from coldsnap.cli import main
from coldsnap.drivers.n610._driver import serve_on
from coldsnap.engines.sglang import SGLangLauncher
from coldsnap.machine import CaptureRequest, ModelRef, RequestError, RestoreRequest, WeightSource
from tests._support import free_port

from .test_restore_port import images  # noqa: F401  (a fixture)

_PAYLOAD = WeightSource(source="payload", payload_dir="/capsule/payload")

LAUNCH = ["python", "-m", "sglang.launch_server"]


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def _record(**kw: object) -> CaptureRecord:
    return CaptureRecord(driver="n610", provider="native", engine="sglang", model_id="m",
                         revision="local", facts={}, **kw)  # type: ignore[arg-type]  # fmt: skip


def _publish(store: Store, tag: str, **kw: object) -> None:
    data = to_json(_record(**kw))
    members = (
        Member("process-image", "image/files.img", store.put_bytes(b"image"), 5),
        Member("record", RECORD_NAME, store.put_bytes(data), len(data)),
    )
    store.publish(Capsule(members=members, identity=None), tag=tag)


def test_a_record_from_format_3_keeps_where_the_command_line_served() -> None:
    record = _record(serve_port=30000, serve_host="0.0.0.0")
    assert read_record(to_json(record)) == record and record.format >= 3
    assert read_record(to_json(attrs.evolve(record, format=3))).serve_port == 30000


def test_a_format_2_record_is_still_read_and_cannot_carry_a_port() -> None:
    data = json.loads(to_json(_record())) | {"format": 2}
    del data["serve_port"], data["serve_host"]
    assert read_record(json.dumps(data)).serve_port is None
    with pytest.raises(RecordError, match="serve_port"):
        read_record(json.dumps(data | {"serve_port": 30000}))


def test_capture_keeps_the_launch_line_s_port_and_host(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    model.mkdir()
    result = cli("capture", "--print-request", "--store", str(tmp_path / "store"), "--", *LAUNCH,
                 "--model-path", str(model), "--port", "30000", "--host", "0.0.0.0")  # fmt: skip
    assert result.exit_code == 0, result.output
    request = json.loads(result.stdout)
    assert (request["serve_port"], request["serve_host"]) == (30000, "0.0.0.0")
    assert "--port" not in request["engine_args"] and "--host" not in request["engine_args"]


def test_a_host_that_is_no_ipv4_address_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(RequestError, match="serve_host"):
        CaptureRequest(driver="n610", provider="native", workdir=str(tmp_path / "w"),
                       store=str(tmp_path / "s"), serve_host="my-host",
                       model=ModelRef(id="m", revision="r", path=str(tmp_path)))  # fmt: skip
    with pytest.raises(RequestError, match="'host'"):
        RestoreRequest(driver="n610", provider="native", artifact="a", workdir=str(tmp_path / "w"),
                       store=str(tmp_path / "s"), host="::1")  # fmt: skip


def test_restore_without_port_serves_on_the_captured_command_line_s(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    _publish(store, "tiny", serve_port=30000, serve_host="0.0.0.0")
    shown = cli("restore", "tiny", "--store", str(store.root), "--print-request")
    assert shown.exit_code == 0, shown.output
    assert (json.loads(shown.stdout)["port"], json.loads(shown.stdout)["host"]) == (
        30000,
        "0.0.0.0",
    )
    given = cli("restore", "tiny", "--store", str(store.root), "--port", "30001", "--host",
                "127.0.0.1", "--print-request")  # fmt: skip
    assert (json.loads(given.stdout)["port"], json.loads(given.stdout)["host"]) == (
        30001,
        "127.0.0.1",
    )


def test_restore_by_request_file_also_defaults_to_the_captured_port(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    _publish(store, "tiny", serve_port=30002)
    request = {
        "kind": "coldsnap.restore-request",
        "driver": "n610",
        "provider": "native",
        "artifact": "tiny",
        "workdir": str(tmp_path / "op"),
        "store": str(store.root),
    }
    (tmp_path / "r.json").write_text(json.dumps(request))
    shown = cli("restore", str(tmp_path / "r.json"), "--print-request")
    assert json.loads(shown.stdout)["port"] == 30002 and json.loads(shown.stdout)["host"] is None


def test_the_captured_port_in_use_is_refused_naming_port(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        _publish(store, "tiny", serve_port=busy.getsockname()[1])
        result = cli("restore", "tiny", "--store", str(store.root),
                     env={"COLDSNAP_SERVING_DIR": str(tmp_path / "serving")})  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "field 'port'" in result.stderr and "the captured command line's --port" in result.stderr
    assert not (tmp_path / "ops").exists() or not any((tmp_path / "ops").iterdir())


def test_n610_host_moves_the_image_s_listener_and_the_url_dials_the_loopback(
    images: Path,  # noqa: F811
) -> None:
    port = free_port()
    url = serve_on(images, "http://127.0.0.1:40000", port, "0.0.0.0")
    assert url == f"http://127.0.0.1:{port}"
    assert [(x.address, x.port) for x in listeners(images)] == [("0.0.0.0", port)]


def test_n610_host_alone_keeps_the_captured_port(images: Path) -> None:  # noqa: F811
    serve_on(images, "http://127.0.0.1:40000", None, "0.0.0.0")
    assert [(x.address, x.port) for x in listeners(images)] == [("0.0.0.0", 40000)]


def test_n580_builds_its_engine_on_the_request_s_host(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    request = RestoreRequest(
        driver="n580", provider="native", artifact="tiny", workdir=str(tmp_path / "op"),
        store=str(tmp_path / "store"), port=31234, host="0.0.0.0",
        model=ModelRef(id="tiny", revision="r1", path=str(tmp_path / "model")),
    )  # fmt: skip
    command = SGLangLauncher().command(request, tmp_path / "op", weights=_PAYLOAD)
    try:
        assert command.url == "http://127.0.0.1:31234"
        assert command.argv[command.argv.index("--host") + 1] == "0.0.0.0"
    finally:
        shutil.rmtree(command.env["COLDSNAP_RUNTIME_DIR"], ignore_errors=True)
