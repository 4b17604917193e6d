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


def test_the_key_file_is_written_before_the_restore_runs(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the restore finds in its workdir when the machine starts (the machine itself is
    stopped there: it is not what this test checks)."""
    from coldsnap import Machine
    from coldsnap._wire import key_path, read_key

    workdir = tmp_path / "restore"
    seen: list[str | None] = []

    class Stop(Exception):
        pass

    def for_request(*args: object, **kwargs: object) -> object:
        seen.append(read_key(workdir))
        raise Stop

    monkeypatch.setattr(Machine, "for_request", staticmethod(for_request))
    monkeypatch.setattr("coldsnap.cli._operations._need_root", lambda what: None)
    monkeypatch.setenv("COLDSNAP_SERVING_DIR", str(tmp_path / "serving"))
    result = cli("restore", "keyed", "--store", str(store), "--workdir", str(workdir), "--",
                 "--api-key", "k3y")  # fmt: skip
    assert isinstance(result.exception, Stop), result.output
    assert seen == ["k3y"]
    assert stat.S_IMODE(key_path(workdir).stat().st_mode) == 0o600
    assert stat.S_IMODE(workdir.stat().st_mode) == 0o700
