"""What `capture` and `restore` make of their input before anything starts: a name is a tag
unless it is plainly a path (never because the current directory holds a file of that name),
request files and recipes that nest too deeply or use YAML aliases are refused naming where,
an empty `--model-path` is refused rather than read as the current directory, and
`--print-request` makes nothing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coldsnap.artifacts import Store
from coldsnap.cli import main
from coldsnap.machine import parse_request

from .test_operations import _publish

LAUNCH = ["python", "-m", "sglang.launch_server"]


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_a_file_named_like_the_tag_is_not_read_as_a_request(tmp_path, monkeypatch) -> None:
    store = Store(tmp_path / "store")
    _publish(store, "t1")
    planted = {"kind": "coldsnap.restore-request", "driver": "n610", "provider": "native",
               "artifact": "evil", "store": str(tmp_path / "elsewhere"),
               "workdir": str(tmp_path / "op")}  # fmt: skip
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "t1").write_text(json.dumps(planted))
    monkeypatch.chdir(tmp_path / "shared")
    result = cli("restore", "t1", "--store", str(store.root), "--print-request")
    assert result.exit_code == 0, result.output
    request = parse_request(json.loads(result.stdout))
    assert (request.artifact, request.store) == ("t1", str(store.root))


@pytest.mark.parametrize("spelling", ["./t1", "sub/t1", ".t1", "t1.json"])
def test_a_name_spelled_as_a_path_is_a_request_file(tmp_path, monkeypatch, spelling) -> None:
    monkeypatch.chdir(tmp_path)
    result = cli("restore", spelling, "--print-request")
    assert result.exit_code == 2 and f"cannot read {spelling}" in result.stderr


def test_a_request_file_nested_too_deeply_is_refused_naming_it(tmp_path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    result = cli("restore", str(path))
    assert result.exit_code == 2 and f"{path} nests deeper" in result.stderr, result.output


def test_a_recipe_nested_too_deeply_is_refused_naming_it(tmp_path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("name: " + "[" * 100_000 + "]" * 100_000 + "\n")
    result = cli("capture", "--recipe", str(path))
    assert result.exit_code == 2 and "line 1: nested deeper than" in result.stderr, result.output


def test_a_yaml_alias_bomb_is_refused_at_its_first_alias(tmp_path) -> None:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in "bcdefghi":
        previous = chr(ord(level) - 1)
        lines.append(f"{level}: &{level} [{', '.join([f'*{previous}'] * 9)}]")
    lines.append("name: *i")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")  # under a kilobyte; 9**9 strings expanded
    started = time.monotonic()
    result = cli("capture", "--recipe", str(path))
    assert time.monotonic() - started < 5  # generous: refused before anything expands
    assert result.exit_code == 2 and "line 2: an alias (*a)" in result.stderr
    assert len(result.stderr) < 400  # the message quotes no expansion


def test_an_empty_model_path_on_the_launch_line_is_refused(tmp_path, monkeypatch) -> None:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    result = cli("capture", "--print-request", "--store", str(tmp_path / "store"), "--",
                 *LAUNCH, "--model-path", "")  # fmt: skip
    assert result.exit_code == 2 and "field '--model-path': is empty" in result.stderr


def test_an_empty_model_path_of_a_restore_is_refused(tmp_path, monkeypatch) -> None:
    store = Store(tmp_path / "store")
    _publish(store, "tiny", provider="recovery")
    monkeypatch.chdir(tmp_path)
    result = cli("restore", "tiny", "--store", str(store.root), "--model-path", "",
                 "--print-request")  # fmt: skip
    assert result.exit_code == 2 and "field '--model-path': is empty" in result.stderr


def test_a_model_path_that_is_no_directory_is_refused_before_the_engine_starts(tmp_path) -> None:
    result = cli("capture", "--print-request", "--store", str(tmp_path / "store"), "--",
                 *LAUNCH, "--model-path", str(tmp_path / "gone"), "--revision", "x")  # fmt: skip
    assert result.exit_code == 2 and "is no directory" in result.stderr, result.output


def test_print_request_makes_no_directory(tmp_path) -> None:
    (tmp_path / "model").mkdir()
    result = cli("capture", "--print-request", "--store", str(tmp_path / "store"), "--",
                 *LAUNCH, "--model-path", str(tmp_path / "model"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert Path(json.loads(result.stdout)["workdir"]).parent == tmp_path / "ops"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    store = Store(tmp_path / "s2" / "store")
    _publish(store, "tiny")
    result = cli("restore", "tiny", "--store", str(store.root), "--print-request")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "s2").iterdir()) == ["store"]


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_gc_grace_must_be_a_finite_number(tmp_path, value) -> None:
    Store(tmp_path / "store")
    result = cli("gc", "--store", str(tmp_path / "store"), "--grace", value)
    assert result.exit_code == 2 and "is not a finite number of seconds" in result.output


def test_a_request_file_s_abbreviated_owned_flag_is_refused(tmp_path) -> None:
    request = {"kind": "coldsnap.restore-request", "driver": "n610", "provider": "native",
               "artifact": "tiny", "engine_args": ["--hos", "0.0.0.0"],
               "workdir": str(tmp_path / "op"), "store": str(tmp_path / "store")}  # fmt: skip
    (tmp_path / "req.json").write_text(json.dumps(request))
    result = cli("restore", str(tmp_path / "req.json"))
    assert result.exit_code == 2
    assert "field 'engine_args': --hos abbreviates --host" in result.stderr
    assert not (tmp_path / "op").exists()


@pytest.mark.parametrize("command", ["status", "stop", "sleep", "wake"])
def test_a_folder_named_like_the_engine_is_not_taken_for_its_workdir(
    tmp_path, monkeypatch, command
) -> None:
    monkeypatch.setenv("COLDSNAP_SERVING_DIR", str(tmp_path / "serving"))
    planted = tmp_path / "shared" / "t1"
    planted.mkdir(parents=True)
    (planted / "receipt.json").write_text(json.dumps({"facts": {"engine_pid": 1}}))
    monkeypatch.chdir(tmp_path / "shared")
    result = cli(command, "t1")
    assert result.exit_code == 2, result.output
    assert "'t1' is neither a name serving here" in result.stderr
    assert "write one as a path: ./t1" in result.stderr


def test_a_key_given_twice_in_a_request_file_is_refused_naming_it(tmp_path) -> None:
    text = ('{"kind": "coldsnap.restore-request", "driver": "n610", "provider": "native", '
            f'"artifact": "tiny", "store": "{tmp_path}/a", "store": "{tmp_path}/b", '
            f'"workdir": "{tmp_path}/op"}}')  # fmt: skip
    (tmp_path / "req.json").write_text(text)
    result = cli("restore", str(tmp_path / "req.json"), "--print-request")
    assert result.exit_code == 2
    assert "coldsnap: bad request: field 'store': is given twice" in result.stderr
