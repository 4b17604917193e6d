"""`--json` events and live progress, fed by a real Machine over the in-memory doubles: every
line is an event the published schema accepts, in the order the steps ran, the last one the
receipt; a failed capture's events name the failure and each compensation; a long step shows
its elapsed time while it runs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import jsonschema
import pytest

from coldsnap.cli._errors import finish
from coldsnap.cli._events import dumps, finished, line_of, schema_text
from coldsnap.cli._progress import LiveSteps
from coldsnap.cli._schema import SCHEMA_DIR
from coldsnap.machine import StepEvent
from coldsnap.testing import FaultPlan, MemoryWorld

from ..machine._support import capture_request, memory_machine

SCHEMA = json.loads(schema_text())


def _run(tmp_path: Path, plan: FaultPlan | None = None) -> list[dict]:
    lines: list[str] = []

    def subscriber(event: StepEvent) -> None:
        line = line_of(event)
        if line is not None:
            lines.append(dumps(line))

    request = capture_request(tmp_path)
    machine = memory_machine(MemoryWorld(cuda=False), request, plan, subscribers=[subscriber])
    receipt = machine.capture(request)
    lines.append(dumps(finished(receipt, {"outcome": receipt.outcome})))
    events = [json.loads(line) for line in lines]
    for event in events:
        jsonschema.validate(event, SCHEMA)
    return events


def test_the_event_schema_in_docs_is_in_sync() -> None:
    assert (SCHEMA_DIR / "event.schema.json").read_text() == schema_text()


def test_a_capture_s_events_pair_each_start_with_its_end_and_end_with_the_receipt(
    tmp_path: Path,
) -> None:
    events = _run(tmp_path)
    assert all(e["kind"] == "coldsnap.event" and e["format"] == 2 for e in events)
    steps = [e for e in events if e["event"] in ("step_started", "step_ended")]
    started = [e["step"] for e in steps if e["event"] == "step_started"]
    ended = [e["step"] for e in steps if e["event"] == "step_ended"]
    assert started == ended and len(started) > 3
    assert [e["event"] for e in steps] == ["step_started", "step_ended"] * len(started)
    progress = [e["detail"] for e in events if e["event"] == "step_progress"]
    assert any(isinstance(d.get("engine_pid"), int) for d in progress), progress
    last = events[-1]
    assert last["event"] == "finished" and last["status"] == "done"
    assert last["receipt"]["kind"] == "coldsnap.receipt"
    assert [s["name"] for s in last["receipt"]["steps"]] == ended


def test_a_failed_capture_names_the_failed_step_and_each_compensation(tmp_path: Path) -> None:
    events = _run(tmp_path, FaultPlan(fail={"driver.dump"}))
    failed = [e for e in events if e["event"] == "step_failed"]
    assert [e["step"] for e in failed] == ["process_dump"]
    assert "injected fault" in failed[0]["detail"]["message"]
    begun = [e["step"] for e in events if e["event"] == "compensation_started"]
    done = [e["step"] for e in events if e["event"] == "step_compensated"]
    assert begun == done and begun, "no compensation was reported"
    assert events[-1]["status"] == "rolled_back"


def test_finish_under_json_prints_the_finished_event_and_exits_with_the_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = capture_request(tmp_path)
    receipt = memory_machine(MemoryWorld(cuda=False), request).capture(request)
    with pytest.raises(SystemExit) as ended:
        finish(receipt, {"name": "tiny"}, events=True)
    assert ended.value.code == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    jsonschema.validate(line, SCHEMA)
    assert line["result"]["name"] == "tiny" and line["result"]["outcome"] == "done"


def _event(step: str, phase: str, seconds: float = 0.0) -> StepEvent:
    return StepEvent(operation="capture", spec="n610.capture", step=step, phase=phase,
                     seconds=seconds)  # fmt: skip


def test_away_from_a_terminal_a_long_step_prints_its_elapsed_time_while_it_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream, now = io.StringIO(), [100.0]
    with LiveSteps(stream=stream, every_s=3600, live=False, clock=lambda: now[0]) as live:
        live(_event("wait_healthy", "started"))
        now[0] += 7.0
        live.tick()  # what the display's thread does every `every_s`
        seen_while_running = stream.getvalue()
        live(_event("wait_healthy", "done", 7.0))
        live.tick()
    assert seen_while_running == "  ... wait_healthy running (7 s)\n"
    assert stream.getvalue() == seen_while_running, "a line after the step ended"
    assert "wait_healthy" in capsys.readouterr().out  # the line once it ended


def test_on_a_terminal_a_spinner_shows_the_running_step(capsys) -> None:
    stream = io.StringIO()
    with LiveSteps(stream=stream, live=True) as live:
        live(_event("seal", "started"))
        assert live.text().startswith("seal running (")
        live(StepEvent(operation="capture", spec="n610.capture", step="seal", phase="progress",
                       detail="capsule_digest=sha256:ab"))  # fmt: skip
        assert live.text().endswith("s): capsule_digest=sha256:ab")
        live(_event("seal", "done", 0.1))
        assert live.text() == ""
    assert "seal" in capsys.readouterr().out
