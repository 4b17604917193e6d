"""`--api-key` in SGLang's launch-line policy and launcher: a capture's command line keeps the bare
flag and drops the key; a request names no key; a keyed engine starts with a throw-away key at
capture and with the restore's key (its workdir's key file) at restore, each written where the
plugin and coldsnap's requests read it; the admin key is refused; the key file is 0600 and
hides its key."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coldsnap._wire import ApiKey, KeyFileError, key_path, read_key, write_key
from coldsnap.engines.sglang import SGLangLauncher
from coldsnap.engines.sglang._cmdline import check_engine_args, parse_command_line
from coldsnap.engines.sglang._keys import KeyConflict, KeyMissing, give_key, hand_over, headers
from coldsnap.machine import CommandLineError, WeightSource

LAUNCH = ["python", "-m", "sglang.launch_server", "--model-path", "/m"]
CHECKPOINT = WeightSource(source="checkpoint", checkpoint="/m")


@pytest.fixture(autouse=True)
def runtime_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher makes each engine's runtime directory here, not on the host."""
    monkeypatch.setattr("coldsnap.engines.sglang._launcher.RUNTIME_ROOT", tmp_path / "engines")


@pytest.mark.parametrize("spelled", [["--api-key", "s3cret"], ["--api-key=s3cret"]])
def test_a_keyed_command_line_keeps_the_flag_and_drops_the_key(spelled: list[str]) -> None:
    line = parse_command_line([*LAUNCH, "--dtype", "half", *spelled])
    assert line.engine_args == ("--dtype", "half", "--api-key")
    assert "s3cret" not in repr(line)


def test_the_admin_key_and_an_abbreviated_key_flag_are_refused() -> None:
    with pytest.raises(CommandLineError) as caught:
        parse_command_line([*LAUNCH, "--admin-api-key", "a", "--api-ke", "b"])
    assert [f for f, _ in caught.value.problems] == ["--admin-api-key", "--api-ke"]


@pytest.mark.parametrize("args", [["--api-key", "s3cret"], ["--api-key=s3cret"],
                                  ["--api-key", "s3cret", "--dtype", "half"]])  # fmt: skip
def test_a_request_names_no_key(args: list[str]) -> None:
    found = check_engine_args(args)
    assert len(found) == 1 and "--api-key takes no value in a request" in found[0][1]


def test_a_request_may_say_the_engine_is_keyed() -> None:
    assert check_engine_args(["--api-key", "--dtype", "half"]) == []
    assert check_engine_args(["--dtype", "half", "--api-key"]) == []


def _request(operation: str, workdir: Path, *args: str) -> Any:
    return SimpleNamespace(operation=operation, model=SimpleNamespace(path="/m"), tp=None,
                           engine_args=("--dtype", "half", *args),
                           workdir=str(workdir))  # fmt: skip


def _runtime_dir(command: Any) -> Path:
    return Path(command.env["COLDSNAP_RUNTIME_DIR"])


def test_a_keyed_capture_starts_with_a_throwaway_key(tmp_path: Path) -> None:
    launcher = SGLangLauncher()
    first = launcher.command(_request("capture", tmp_path, "--api-key"), tmp_path,
                             weights=CHECKPOINT)  # fmt: skip
    key = read_key(tmp_path)
    assert key and read_key(_runtime_dir(first)) == key
    at = first.argv.index("--api-key")
    assert first.argv[at + 1] == key and first.argv.count("--api-key") == 1
    assert not any(key in value for value in first.env.values())
    again = launcher.command(_request("capture", tmp_path, "--api-key"), tmp_path,
                             weights=CHECKPOINT)  # fmt: skip
    assert read_key(tmp_path) not in (None, key), "each keyed engine gets a fresh key"
    assert read_key(_runtime_dir(again)) == read_key(tmp_path)


def test_a_keyed_restore_starts_with_the_key_it_was_given(tmp_path: Path) -> None:
    give_key(tmp_path / "restore", "the-operator-key")
    command = SGLangLauncher().command(_request("restore", tmp_path / "restore", "--api-key"),
                                       tmp_path, weights=CHECKPOINT)  # fmt: skip
    assert command.argv[command.argv.index("--api-key") + 1] == "the-operator-key"
    assert read_key(_runtime_dir(command)) == "the-operator-key"


def test_a_keyed_restore_without_a_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyMissing, match="holds no key"):
        SGLangLauncher().command(_request("restore", tmp_path, "--api-key"), tmp_path,
                                 weights=CHECKPOINT)  # fmt: skip
    with pytest.raises(KeyMissing):
        hand_over(_request("restore", tmp_path, "--api-key"), tmp_path / "runtime")


def test_an_unkeyed_engine_has_no_key_anywhere(tmp_path: Path) -> None:
    command = SGLangLauncher().command(_request("capture", tmp_path), tmp_path, weights=CHECKPOINT)
    assert "--api-key" not in command.argv
    assert read_key(tmp_path) is None and read_key(_runtime_dir(command)) is None
    hand_over(_request("restore", tmp_path), tmp_path / "runtime")
    assert not (tmp_path / "runtime").exists()


def test_a_resumed_engine_is_handed_the_restore_s_key(tmp_path: Path) -> None:
    give_key(tmp_path / "restore", "the-operator-key")
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    hand_over(_request("restore", tmp_path / "restore", "--api-key"), runtime)
    assert read_key(runtime) == "the-operator-key"


def test_a_runtime_dir_keyed_otherwise_is_not_rekeyed(tmp_path: Path) -> None:
    """A replica shares its runtime directory with the engine restored beside it: a restore
    given another key is refused rather than changing that serving engine's key; a resumed
    restore given the same key writes it again."""
    give_key(tmp_path / "restore", "the-operator-key")
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    write_key(runtime, "the-key-another-restore-serves-with")
    with pytest.raises(KeyConflict, match="holds another key"):
        hand_over(_request("restore", tmp_path / "restore", "--api-key"), runtime)
    assert read_key(runtime) == "the-key-another-restore-serves-with"
    write_key(runtime, "the-operator-key")
    hand_over(_request("restore", tmp_path / "restore", "--api-key"), runtime)
    assert read_key(runtime) == "the-operator-key"


def test_coldsnap_s_requests_carry_the_operation_s_key(tmp_path: Path) -> None:
    give_key(tmp_path / "restore", "the-operator-key")
    assert headers(_request("restore", tmp_path / "restore")) == {
        "Authorization": "Bearer the-operator-key"
    }
    sleep = SimpleNamespace(operation="sleep", target=str(tmp_path / "restore"),
                            workdir=str(tmp_path / "ops"))  # fmt: skip
    assert headers(sleep) == {"Authorization": "Bearer the-operator-key"}
    assert headers(_request("restore", tmp_path / "other")) == {}


def test_the_key_file_is_private_strict_and_hides_its_key(tmp_path: Path) -> None:
    path = write_key(tmp_path, "k1")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"format": 1, "kind": "coldsnap.api-key", "key": "k1"}
    assert "k1" not in repr(ApiKey(key="k1"))
    for bad, field in (({"format": 1, "kind": "coldsnap.api-key", "key": "k", "x": 1}, "'x'"),
                       ({"format": 1, "kind": "other", "key": "k"}, "'kind'"),
                       ({"format": 1, "kind": "coldsnap.api-key", "key": ""}, "'key'"),
                       ({"format": 1, "kind": "coldsnap.api-key", "key": 7}, "'key'")):  # fmt: skip
        key_path(tmp_path).write_text(json.dumps(bad))
        with pytest.raises(KeyFileError, match=field):
            read_key(tmp_path)
    key_path(tmp_path).write_text("k1")
    with pytest.raises(KeyFileError, match="not readable as a key record"):
        read_key(tmp_path)
