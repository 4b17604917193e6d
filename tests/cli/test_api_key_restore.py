"""`coldsnap restore NAME -- --api-key KEY`: the key never joins the request (its engine arguments
keep the bare flag the capsule binds) and lands in the restore's workdir as a 0600 key file; a
keyed capsule restored without a key, and a key for a capsule captured without one, are bad
requests (exit 2) before anything starts."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coldsnap.artifacts import Capsule, Member, Store, to_json
from coldsnap.capsules import RECORD_NAME, CaptureRecord
from coldsnap.cli import main
from coldsnap.cli._restore_flags import check_key, split_key
from coldsnap.machine import RequestError


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _publish(store: Store, tag: str, engine_args: tuple[str, ...], driver: str = "n610") -> None:
    record = CaptureRecord(driver=driver, provider="native", engine="sglang", model_id="tiny",  # type: ignore[call-arg]
                           revision="local", facts={}, engine_args=engine_args)  # fmt: skip
    data = to_json(record)
    members = (
        Member("process-image", "image/files.img", store.put_bytes(tag.encode()), len(tag)),
        Member("record", RECORD_NAME, store.put_bytes(data), len(data)),
    )
    store.publish(Capsule(members=members, identity=None), tag=tag)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    opened = Store(tmp_path / "store")
    _publish(opened, "keyed", ("--dtype", "float32", "--api-key"))
    _publish(opened, "plain", ("--dtype", "float32"))
    _publish(opened, "plain580", ("--dtype", "float32"), driver="n580")
    return tmp_path / "store"


def test_restore_help_says_how_a_keyed_capsule_is_given_its_key() -> None:
    text = " ".join(cli("restore", "--help").output.split())
    assert "A keyed capsule (captured with --api-key) is given the key" in text
    assert "`-- --api-key KEY`" in text


@pytest.mark.parametrize("given", [("--api-key", "k3y"), ("--api-key=k3y",),
                                   ("--api-key", "k3y", "--api-key=k3y")])  # fmt: skip
def test_the_key_leaves_the_flags_and_the_flag_stays(given: tuple[str, ...]) -> None:
    assert split_key(("--log-level", "info", *given)) == (("--log-level", "info", "--api-key"),
                                                          "k3y")  # fmt: skip
    assert split_key(("--log-level", "info")) == (("--log-level", "info"), None)


@pytest.mark.parametrize(
    "given",
    [("--api-key",), ("--api-key", "--log-level", "info"), ("--api-key=",),
     ("--api-key", "a", "--api-key", "b")],
)  # fmt: skip
def test_a_key_flag_without_one_key_is_refused(given: tuple[str, ...]) -> None:
    with pytest.raises(RequestError) as caught:
        split_key(given)
    assert caught.value.fields == ("--api-key",)


def test_a_keyed_capsule_needs_a_key() -> None:
    check_key(("--api-key",), "k3y", "keyed")
    check_key(("--dtype", "half"), None, "plain")
    with pytest.raises(RequestError, match="capsule keyed was captured with --api-key"):
        check_key(("--dtype", "half", "--api-key"), None, "keyed")


def test_print_request_keeps_the_bare_flag_and_writes_no_key(store: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "restore"
    result = cli("restore", "keyed", "--store", str(store), "--workdir", str(workdir),
                 "--print-request", "--", "--api-key", "k3y")  # fmt: skip
    assert result.exit_code == 0, result.output
    request = json.loads(result.stdout)
    assert request["engine_args"] == ["--dtype", "float32", "--api-key"]
    assert "k3y" not in result.output and not workdir.exists()


def test_a_keyed_capsule_restored_without_a_key_is_a_bad_request(store: Path) -> None:
    result = cli("restore", "keyed", "--store", str(store))
    assert result.exit_code == 2, result.output
    assert "--api-key" in result.stderr and "was captured with --api-key" in result.stderr


@pytest.mark.parametrize("tag", ["plain", "plain580"])
def test_a_key_for_a_capsule_captured_without_one_is_a_bad_request(store: Path, tag: str) -> None:
    result = cli("restore", tag, "--store", str(store), "--model-path", str(store), "--",
                 "--api-key", "k3y")  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "captured without --api-key" in result.stderr and "k3y" not in result.output


class _Started(Exception):
    """Raised where the machine would start: what the restore prepared is then checked."""


@pytest.fixture
def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, str | None]]:
    """(the request, the key its workdir holds) where each restore's machine would start."""
    from coldsnap import Machine
    from coldsnap._wire import read_key

    seen: list[tuple[object, str | None]] = []

    def for_request(request: object, *args: object, **kwargs: object) -> object:
        seen.append((request, read_key(Path(request.workdir))))  # type: ignore[attr-defined]
        raise _Started

    monkeypatch.setattr(Machine, "for_request", staticmethod(for_request))
    monkeypatch.setattr("coldsnap.cli._operations._need_root", lambda what: None)
    monkeypatch.setenv("COLDSNAP_SERVING_DIR", str(tmp_path / "serving"))
    return seen


def test_the_key_file_is_written_before_the_restore_runs(
    store: Path, tmp_path: Path, started: list[tuple[object, str | None]]
) -> None:
    from coldsnap._wire import key_path

    workdir = tmp_path / "restore"
    result = cli("restore", "keyed", "--store", str(store), "--workdir", str(workdir), "--",
                 "--api-key", "k3y")  # fmt: skip
    assert isinstance(result.exception, _Started), result.output
    [(request, key)] = started
    assert key == "k3y" and request.engine_args == ("--dtype", "float32", "--api-key")  # type: ignore[attr-defined]
    assert stat.S_IMODE(key_path(workdir).stat().st_mode) == 0o600
    assert stat.S_IMODE(workdir.stat().st_mode) == 0o700


def _request_file(tmp_path: Path, store: Path, *engine_args: str) -> dict[str, object]:
    return {"kind": "coldsnap.restore-request", "format": 1, "driver": "n610",
            "provider": "native", "artifact": "keyed", "store": str(store),
            "workdir": str(tmp_path / "restore"),
            "engine_args": ["--dtype", "float32", *engine_args]}  # fmt: skip


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_request_file_s_key_leaves_the_request_as_on_the_command_line(
    store: Path, tmp_path: Path, started: list[tuple[object, str | None]], suffix: str
) -> None:
    data = _request_file(tmp_path, store, "--api-key", "k3y")
    path = tmp_path / f"restore{suffix}"
    path.write_text(json.dumps(data))  # JSON is YAML too
    result = cli("restore", str(path))
    assert isinstance(result.exception, _Started), result.output
    [(request, key)] = started
    assert key == "k3y" and request.engine_args == ("--dtype", "float32", "--api-key")  # type: ignore[attr-defined]


def test_a_request_file_with_the_bare_flag_needs_its_workdir_s_key(
    store: Path, tmp_path: Path, started: list[tuple[object, str | None]]
) -> None:
    from coldsnap._wire import write_key

    path = tmp_path / "restore.json"
    path.write_text(json.dumps(_request_file(tmp_path, store, "--api-key")))
    result = cli("restore", str(path))
    assert result.exit_code == 2 and "was captured with --api-key" in result.stderr, result.output
    (tmp_path / "restore").mkdir(mode=0o700)
    write_key(tmp_path / "restore", "k3y")
    result = cli("restore", str(path))
    assert isinstance(result.exception, _Started), result.output
    assert started[0][1] == "k3y"
