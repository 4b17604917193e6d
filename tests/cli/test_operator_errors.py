"""What an operator's mistakes are told, before anything starts: the flag that is wrong and the
fix that works (a model path that is no directory, a capsule of a local model restored without
its path, an unknown tag with the tags there are, engine flags a restore cannot honour), and a
mistyped engine flag as SGLang's one line, not its usage text."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coldsnap.artifacts import Capsule, Member, Store, to_json
from coldsnap.capsules import RECORD_NAME, CaptureRecord
from coldsnap.cli import main
from coldsnap.engines.sglang._cmdline import refused_line

LAUNCH = ["python", "-m", "sglang.launch_server"]
CAPTURED = ("--dtype", "float32", "--log-level", "info")


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _publish(store: Store, tag: str, **kw: object) -> None:
    record = {"driver": "n610", "provider": "native", "engine": "sglang", "model_id": "tiny",
              "revision": "local", "facts": {}, "engine_args": CAPTURED} | kw  # fmt: skip
    data = to_json(CaptureRecord(**record))  # type: ignore[arg-type]
    members = (
        Member("process-image", "image/files.img", store.put_bytes(tag.encode()), len(tag)),
        Member("record", RECORD_NAME, store.put_bytes(data), len(data)),
    )
    store.publish(Capsule(members=members, identity=None), tag=tag)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    opened = Store(tmp_path / "store")
    _publish(opened, "tiny")
    _publish(opened, "tiny580", driver="n580")
    _publish(opened, "pinned", provider="recovery")
    return tmp_path / "store"


def _field(result: Result) -> str:
    assert result.exit_code == 2, result.output
    return result.output


def test_a_model_path_that_is_no_directory_is_blamed_on_itself(tmp_path: Path) -> None:
    result = cli("capture", "--print-request", "--store", str(tmp_path / "s"), "--", *LAUNCH,
                 "--model-path", "tiny-mistyped")  # fmt: skip
    out = _field(result)
    assert "field '--model-path': 'tiny-mistyped' is no directory here" in out
    assert "give its revision with --revision" in out


def test_an_unknown_tag_is_a_bad_request_listing_the_tags(store: Path) -> None:
    out = _field(cli("restore", "tiyn", "--store", str(store), "--print-request"))
    assert "no tag 'tiyn'" in out and "(tags: pinned, tiny, tiny580)" in out


def test_a_local_model_s_capsule_asks_for_its_directory_not_a_download(store: Path) -> None:
    out = _field(cli("restore", "pinned", "--store", str(store), "--print-request"))
    assert "field '--model-path': capsule pinned was captured from a local directory" in out
    assert "hf download" not in out


def test_an_engine_flag_a_resumed_process_cannot_take_is_refused_up_front(store: Path) -> None:
    out = _field(cli("restore", "tiny", "--store", str(store), "--port", "30800", "--",
                     "--max-running-requests", "4"))  # fmt: skip
    assert "field '--max-running-requests': captured absent, asked --max-running-requests 4" in out
    assert "resumes the captured process" in out
    assert not (store.parent / "ops").exists()  # refused before any workdir or journal
    # Even a flag that only changes what the engine reports: the process keeps its own.
    out = _field(cli("restore", "tiny", "--store", str(store), "--print-request", "--",
                     "--log-level", "debug"))  # fmt: skip
    assert "field '--log-level': captured --log-level info, asked --log-level debug" in out


def test_an_engine_built_at_restore_asks_for_a_local_model_s_directory(store: Path) -> None:
    out = _field(cli("restore", "tiny580", "--store", str(store), "--print-request"))
    assert "field '--model-path': capsule tiny580 was captured from a local directory" in out
    assert "driver n580 builds the engine at restore" in out and "hf download" not in out


def test_an_engine_built_at_restore_takes_the_flags_it_may_change(store: Path) -> None:
    model = ("--model-path", str(store.parent))
    result = cli("restore", "tiny580", "--store", str(store), "--print-request", *model, "--",
                 "--log-level", "debug")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["engine_args"] == ["--dtype", "float32", "--log-level",
                                                        "debug"]  # fmt: skip
    out = _field(cli("restore", "tiny580", "--store", str(store), "--print-request", *model,
                     "--", "--max-running-requests", "4"))  # fmt: skip
    assert "field '--max-running-requests'" in out and "the capsule binds the flags" in out


@pytest.mark.parametrize("prog", ["launch_server.py", "sglang serve"])
def test_a_mistyped_engine_flag_is_the_parser_s_one_line(prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog)
    for n in range(200):
        parser.add_argument(f"--flag-number-{n}", help="a flag SGLang has " * 3)
    parser.add_argument("--max-running-requests", type=int)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        parser.parse_args(["--max-runing-requests", "4"])
    log = "INFO some start-up line\n" + err.getvalue()
    tail = log[-4000:]  # what the engine step reads: the usage's first line is cut off
    assert "usage:" not in tail and len(tail.splitlines()) > 20
    assert refused_line(tail) == f"{prog}: error: unrecognized arguments: --max-runing-requests 4"
    assert refused_line("Traceback (most recent call last):\nValueError: x\n") is None
    assert refused_line("RuntimeError: error: no usage text before it\n") is None


def test_flags_are_set_over_the_capsule_s_by_name() -> None:
    from coldsnap.cli._restore_flags import set_over

    captured = ["--dtype", "float32", "--a", "1", "--a", "2", "--x", "-1"]
    assert set_over(captured, ["--a=3"]) == ("--dtype", "float32", "--x", "-1", "--a=3")
    assert set_over(captured, ["--x", "-2"]) == ("--dtype", "float32", "--a", "1", "--a", "2",
                                                 "--x", "-2")  # fmt: skip
    assert set_over(captured, []) == tuple(captured)
