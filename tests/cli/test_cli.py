"""The command line: docs stay in sync with the registered specs; `plan` shows what a request
would run without running it; the test doubles are not reachable from it; bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from coldsnap.cli import main
from coldsnap.cli._main import DOCS
from coldsnap.machine import REGISTRY, document


def test_state_machine_docs_are_in_sync() -> None:
    assert DOCS.read_text() == document(REGISTRY.specs()), "run `coldsnap docs`"


def test_docs_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    out = tmp_path / "sm.md"
    out.write_text("stale")
    result = CliRunner().invoke(main, ["docs", "--check", "--out", str(out)])
    assert result.exit_code != 0 and "is stale" in result.output


def _request_file(tmp_path: Path, **fields: Any) -> Path:
    (tmp_path / "model").mkdir(exist_ok=True)
    request = {
        "kind": "coldsnap.capture-request", "driver": "n610", "provider": "native",
        "engine": "sglang",
        "model": {"id": "tiny", "revision": "r1", "path": str(tmp_path / "model")},
        "workdir": str(tmp_path / "op"), "store": str(tmp_path / "store"),
    }  # fmt: skip
    request.update(fields)
    path = tmp_path / "req.json"
    path.write_text(json.dumps(request))
    return path


def _plan(path: Path) -> dict[str, str]:
    """`coldsnap plan` run on `path`: each step's name -> 'run' or 'skip'."""
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines()[1:]]
    return {row[2]: row[1] for row in rows if row[0].isdigit()}


def test_plan_shows_the_steps_a_capture_runs_and_touches_nothing(tmp_path: Path) -> None:
    path = _request_file(tmp_path)
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("capture-n610: driver n610, provider native, engine sglang")
    assert "[guard payload: holds]" in result.output
    assert "makes  payload_dir, payload_bytes, packs" in result.output
    steps = _plan(path)
    assert steps["launch_engine"] == steps["export_payload"] == steps["seal_artifact"] == "run"
    assert steps["retire_source"] == "run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "req.json"]


def test_plan_follows_the_request(tmp_path: Path) -> None:
    assert _plan(_request_file(tmp_path, keep_source=True))["retire_source"] == "skip"
    recovery = _plan(_request_file(tmp_path, provider="recovery"))
    assert recovery["export_payload"] == "skip"
    restore = _request_file(
        tmp_path, kind="coldsnap.restore-request", provider="recovery", artifact="cap"
    )
    steps = _plan(restore)
    assert steps["admit"] == steps["verify_checkpoint"] == "run"
    assert steps["stage_payload"] == "skip"


@pytest.mark.parametrize("command", ["capture", "restore"])
def test_operations_have_no_dry_run(tmp_path: Path, command: str) -> None:
    """The product runs the real components only; doubles live in coldsnap.testing."""
    result = CliRunner().invoke(main, [command, "--dry-run", str(_request_file(tmp_path))])
    assert (
        result.exit_code == 2 and "No such option" in result.output and "--dry-run" in result.output
    )


def test_a_bad_request_file_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "req.json"
    path.write_text(json.dumps({"kind": "coldsnap.restore-request", "driver": "n610",
                                "provider": "native", "artifact": "x",
                                "workdir": "rel", "store": str(tmp_path)}))  # fmt: skip
    result = CliRunner().invoke(main, ["restore", str(path)])
    assert result.exit_code == 2
    assert "field 'workdir': must be an absolute path" in result.stderr
    assert not (tmp_path / "rel").exists()


# -- exit codes and errors -------------------------------------------------------------------------


def _one_line_error(result: Any) -> str:
    assert "Traceback" not in result.stderr and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("coldsnap: "), result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"keep_source": "false"}, "keep_source"),
        ({"engine_args": "--abc"}, "engine_args"),
        ({"tp": 2.7}, "tp"),
        ({"colour": "blue"}, "colour"),
        ({"model": {"id": "x", "revision": 1, "path": "/"}}, "model.revision"),
    ],
)
@pytest.mark.parametrize("command", ["capture", "plan"])
def test_a_request_is_parsed_strictly(tmp_path: Path, command: str, fields, field) -> None:
    result = CliRunner().invoke(main, [command, str(_request_file(tmp_path, **fields))])
    assert result.exit_code == 2
    assert f"'{field}'" in _one_line_error(result)
    assert not (tmp_path / "op").exists()


def test_a_request_that_is_not_json_is_a_bad_request(tmp_path: Path) -> None:
    path = tmp_path / "req.json"
    path.write_text("{not json")
    result = CliRunner().invoke(main, ["capture", str(path)])
    assert result.exit_code == 2
    assert "req.json" in _one_line_error(result)


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    path = _request_file(tmp_path, tp=2.7)
    result = CliRunner().invoke(main, ["--debug", "capture", str(path)])
    assert result.exit_code == 2 and "Traceback" in result.stderr


def test_resume_of_a_workdir_without_a_journal_is_a_bad_request(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["resume", str(tmp_path)])
    assert result.exit_code == 2
    assert "no journal" in _one_line_error(result)


def _memory(monkeypatch, plan) -> None:
    from coldsnap.machine import Machine
    from coldsnap.testing import MemoryWorld
    from tests.machine._support import memory_machine

    world = MemoryWorld()

    def for_request(request, **kw):
        return memory_machine(world, request, plan, **kw)

    monkeypatch.setattr(Machine, "for_request", staticmethod(for_request))


@pytest.mark.parametrize(
    ("fail", "code", "outcome"),
    [
        (set(), 0, "done"),
        ({"provider.export"}, 3, "rolled_back"),
        ({"provider.export", "comp:driver.stop_engine"}, 4, "failed"),
    ],
)
def test_exit_codes_say_how_an_operation_ended(tmp_path, monkeypatch, fail, code, outcome) -> None:
    from coldsnap.testing import FaultPlan

    _memory(monkeypatch, FaultPlan(fail=fail))
    result = CliRunner().invoke(main, ["capture", str(_request_file(tmp_path))])
    assert result.exit_code == code, result.output + result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["outcome"] == outcome
    if code:
        assert _one_line_error(result).startswith(f"coldsnap: {outcome}")


def test_a_missing_environment_exits_5(tmp_path, monkeypatch) -> None:
    from coldsnap.backends import CriuUnavailable
    from coldsnap.machine import Machine

    def for_request(request, **kw):
        raise CriuUnavailable("version", "no criu binary found; run scripts/setup-criu.sh")

    monkeypatch.setattr(Machine, "for_request", staticmethod(for_request))
    result = CliRunner().invoke(main, ["capture", str(_request_file(tmp_path))])
    assert result.exit_code == 5
    assert "no criu binary" in _one_line_error(result)
