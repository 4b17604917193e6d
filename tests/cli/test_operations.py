"""`coldsnap capture` and `restore` up to the Machine: the request a command line or a capsule
name makes (--print-request), what each form refuses, and `--help` showing how."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coldsnap.artifacts import Capsule, Member, Store, to_json
from coldsnap.capsules import RECORD_NAME, CaptureRecord
from coldsnap.cli import main
from coldsnap.machine import CaptureRequest, RestoreRequest, parse_request

LAUNCH = ["python", "-m", "sglang.launch_server"]


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "tiny-llama"
    path.mkdir(parents=True)
    return path


def test_capture_help_shows_how(tmp_path: Path) -> None:
    text = cli("capture", "--help").output
    assert "coldsnap capture --name tiny --store /var/lib/coldsnap/store -- \\\n" in text
    assert "python -m sglang.launch_server --model-path /models/tiny --port 30000" in text
    for words in ("coldsnap capture REQUEST_FILE", "coldsnap schema capture", "--print-request",
                  "sglang serve", "--api-key"):  # fmt: skip
        assert words in text


def test_print_request_makes_the_request_file_of_a_command_line(tmp_path, model) -> None:
    store = tmp_path / "store"
    flags = ["--model-path", str(model), "--port", "30000", "--tp", "1", "--dtype", "bfloat16"]
    result = cli("capture", "--print-request", "--store", str(store), "--", *LAUNCH, *flags)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    request = parse_request(data)
    assert isinstance(request, CaptureRequest)
    assert (request.model.id, request.model.revision, request.model.path) == (
        "tiny-llama", "local", str(model))  # fmt: skip
    assert request.name == "tiny-llama" and request.tp == 1 and request.store == str(store)
    assert request.engine_args == ("--dtype", "bfloat16")
    assert Path(request.workdir).parent == tmp_path / "ops"
    assert "restores serve on your 127.0.0.1:30000" in result.stderr
    assert request.serve_port == 30000 and request.serve_host is None
    assert not store.exists(), "--print-request made the store"


def test_capture_options_go_with_a_command_line_only(tmp_path: Path) -> None:
    request = tmp_path / "req.json"
    request.write_text("{}")
    result = cli("capture", "--name", "x", str(request))
    assert result.exit_code == 2 and "--name: a request file says this itself" in result.output


def test_a_refused_flag_is_named_before_anything_starts(tmp_path, model) -> None:
    result = cli("capture", "--store", str(tmp_path / "s"), "--", *LAUNCH, "--model-path",
                 str(model), "--admin-api-key", "secret")  # fmt: skip
    assert result.exit_code == 2
    assert "cannot capture this command line: --admin-api-key cannot be captured" in result.stderr
    assert not (tmp_path / "ops").exists() or not any((tmp_path / "ops").iterdir())


def test_a_request_file_with_port_in_engine_args_is_refused_naming_the_field(tmp_path) -> None:
    request = {"kind": "coldsnap.restore-request", "driver": "n610", "provider": "native",
               "artifact": "tiny", "engine_args": ["--port", "30000"],
               "workdir": str(tmp_path / "op"), "store": str(tmp_path / "store")}  # fmt: skip
    (tmp_path / "req.json").write_text(json.dumps(request))
    result = cli("restore", str(tmp_path / "req.json"))
    assert result.exit_code == 2
    assert "field 'engine_args': --port is coldsnap's to set" in result.stderr
    assert "the request's host and port say where the engine listens" in result.stderr


def _publish(
    store: Store,
    tag: str,
    *,
    driver: str = "n610",
    provider: str = "native",
    args: tuple[str, ...] = (),
    revision: str = "local",
) -> str:
    record = to_json(
        CaptureRecord(
            driver=driver,
            provider=provider,
            engine="sglang",
            model_id="tiny-llama",
            revision=revision,
            facts={},
            engine_args=args,
        )
    )
    members = (
        Member("process-image", "image/files.img", store.put_bytes(b"image"), 5),
        Member("record", RECORD_NAME, store.put_bytes(record), len(record)),
    )
    return store.publish(Capsule(members=members, identity=None), tag=tag)


def test_restore_by_name_takes_the_capsule_s_components_and_engine_flags(tmp_path) -> None:
    store = Store(tmp_path / "store")
    _publish(store, "tiny", args=("--dtype", "bfloat16"))
    result = cli("restore", "tiny", "--store", str(store.root), "--port", "30001",
                 "--print-request")  # fmt: skip
    assert result.exit_code == 0, result.output
    request = parse_request(json.loads(result.stdout))
    assert isinstance(request, RestoreRequest)
    assert (request.driver, request.provider, request.engine) == ("n610", "native", "sglang")
    assert request.artifact == "tiny" and request.port == 30001 and request.model is None
    assert request.engine_args == ("--dtype", "bfloat16")
    assert Path(request.workdir).parent == tmp_path / "ops"


def test_a_restore_that_needs_the_model_says_why_the_cache_has_none(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    store = Store(tmp_path / "store")
    _publish(store, "tiny", provider="recovery", revision="abc123")
    result = cli("restore", "tiny", "--store", str(store.root), "--print-request")
    assert result.exit_code == 2, result.output
    assert "field 'model'" in result.stderr
    assert "not in the local Hugging Face cache" in result.stderr


def test_restore_flags_after_the_name_replace_the_capture_s(tmp_path) -> None:
    store = Store(tmp_path / "store")
    _publish(store, "tiny", driver="n580", args=("--log-level", "info", "--dtype", "bfloat16"))
    result = cli("restore", "tiny", "--store", str(store.root), "--print-request",
                 "--model-path", str(tmp_path), "--", "--log-level", "debug")  # fmt: skip
    assert json.loads(result.stdout)["engine_args"] == ["--dtype", "bfloat16", "--log-level",
                                                        "debug"]  # fmt: skip


def test_restore_of_a_missing_capsule_names_it(tmp_path) -> None:
    Store(tmp_path / "store")
    result = cli("restore", "nothing", "--store", str(tmp_path / "store"))
    assert result.exit_code != 0 and "nothing" in result.stderr


def test_restore_on_a_port_in_use_is_refused_before_it_starts(tmp_path) -> None:
    store = Store(tmp_path / "store")
    _publish(store, "tiny")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli("restore", "tiny", "--store", str(store.root), "--port", str(port),
                     env={"COLDSNAP_SERVING_DIR": str(tmp_path / "serving")})  # fmt: skip
    assert result.exit_code == 2
    assert f"field 'port': port {port} on 127.0.0.1 is in use" in result.stderr
    assert not (tmp_path / "ops").exists() or not any((tmp_path / "ops").iterdir())


def test_a_request_file_takes_only_port_serve_as_and_json(tmp_path) -> None:
    (tmp_path / "req.json").write_text("{}")
    result = cli("restore", str(tmp_path / "req.json"), "--store", str(tmp_path))
    assert result.exit_code == 2 and "--store: a request file says this itself" in result.output
