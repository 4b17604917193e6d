"""The SGLang adapter's sleep and wake steps against httpx.MockTransport: what each asks the
engine, what it reads of the plugin's status records, and what it leaves undone. The whole
operations through the Machine: tests/cli/test_sleep.py; killed and resumed on a real engine:
tests/e2e/test_fault_campaign.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest

from coldsnap._wire import PLAN_FILE, STATUS_FORMAT, STATUS_KIND, status_path
from coldsnap.engines import EngineError
from coldsnap.engines.sglang import SGLangEngine, SGLangLauncher, register
from coldsnap.engines.sglang._specs import SLEEP, SLEEP_RECORD, WAKE
from coldsnap.machine import InstalledBuild, Registry, Skipped, StepTimeout
from coldsnap.machine import steps as s

from .test_sglang_steps import GIB, MockSGLang, ctx, measured


def _engine(mock: MockSGLang, *, rank_reports: bool = False) -> SGLangEngine:
    return SGLangEngine(
        SGLangLauncher(()),
        rank_reports=rank_reports,
        identity=lambda: InstalledBuild(
            engine="sglang", version="0", contract="sha256:x", plugin_digest="sha256:x"
        ),
        transport=httpx.MockTransport(mock),
    )


def _gate(runtime_dir: Path, released: list[str], *, last: str = "released", pid: int = 0) -> None:
    """The HTTP server's status record as the plugin's health gate writes it."""
    record = {
        "format": STATUS_FORMAT,
        "kind": STATUS_KIND,
        "process": "main",
        "pid": pid or os.getpid(),
        "role": "main",
        "mode": "off",
        "released_tags": released,
        "events": [{"event": last, "time": time.time()}],
    }
    path = status_path(runtime_dir, "main")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_the_adapter_registers_its_sleep_and_wake_specs() -> None:
    registry = Registry(entry_points=False)
    register(registry)
    assert registry.spec("sleep", "sglang") is SLEEP
    assert registry.spec("wake", "sglang") is WAKE
    assert [st.name for st in SLEEP.steps] == ["quiesce", "release"]
    release = SLEEP.step("release")
    assert release.compensation == "engine.wake_in_place"
    assert {st.compensation for st in WAKE.steps if st.side_effect} == {"engine.sleep_again"}
    # wake verifies again: its weight source is made by the provider's stage, never seeded
    assert s.WEIGHT_SOURCE not in WAKE.seeds
    assert {st.name for st in WAKE.steps} >= {"stage_payload", "verify_checkpoint"}


def test_sleep_releases_without_export_and_reports_each_rank(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path, report=measured(), ranks=2)
    capsule = {s.TP_SIZE.name: 2}
    made = _engine(mock, rank_reports=True).sleep_release(
        ctx(tmp_path, **{s.CAPSULE.name: capsule})
    )
    assert set(made) == {SLEEP_RECORD.name}
    record = made[SLEEP_RECORD.name]
    assert sorted(record["ranks"]) == ["scheduler-tp0", "scheduler-tp1"]
    assert record["device_freed"] == 2 * (43 * GIB - 5) and record["exported"] is False
    assert record["healthy_while_asleep"] is True  # the mock's health does not close
    assert mock.tags("/release_memory_occupation") == [["kv_cache", "weights"]]


def test_sleep_names_a_missing_rank(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path, report=measured(), ranks=1)
    with pytest.raises(EngineError) as err:
        _engine(mock, rank_reports=True).sleep_release(
            ctx(tmp_path, **{s.CAPSULE.name: {s.TP_SIZE.name: 2}})
        )
    assert "release" in str(err.value) and "rank 1" in str(err.value)


def test_sleep_names_a_rank_whose_release_failed(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path, outcome="failed")
    with pytest.raises(EngineError, match="scheduler-tp0: the plugin refused"):
        _engine(mock).sleep_release(ctx(tmp_path))


def test_undoing_a_sleep_resumes_what_is_released_never_preverified(tmp_path: Path) -> None:
    mock = MockSGLang()
    _gate(tmp_path, ["kv_cache", "weights"])
    source = {"source": "payload", "payload_dir": str(tmp_path / "payload"), "preverified": True}
    result = _engine(mock).wake_in_place(ctx(tmp_path, **{s.WEIGHT_SOURCE.name: source}))
    assert result is None
    assert mock.tags("/resume_memory_occupation") == [["weights"], ["kv_cache"]]
    plan = json.loads((tmp_path / PLAN_FILE).read_text())
    assert plan["payload_dir"] == str(tmp_path / "payload") and plan["preverified"] is False


def test_undoing_a_sleep_that_released_nothing_is_skipped(tmp_path: Path) -> None:
    mock = MockSGLang()
    _gate(tmp_path, [])
    assert isinstance(_engine(mock).wake_in_place(ctx(tmp_path)), Skipped)
    assert mock.calls == []


def test_undoing_a_wake_releases_only_what_it_resumed(tmp_path: Path) -> None:
    mock = MockSGLang()
    _gate(tmp_path, ["kv_cache"], last="resumed")  # the weights came back, the KV cache did not
    assert _engine(mock).sleep_again(ctx(tmp_path)) is None
    assert mock.tags("/release_memory_occupation") == [["weights"]]
    _gate(tmp_path, ["kv_cache", "weights"])
    assert isinstance(_engine(mock).sleep_again(ctx(tmp_path)), Skipped)
    assert len(mock.calls) == 1


def test_a_call_still_in_flight_is_waited_for_until_the_deadline(tmp_path: Path) -> None:
    """An orchestrator that died mid-release leaves the engine releasing (its gate closed):
    what to undo is known only once that call ended."""
    _gate(tmp_path, [], last="gate_closed")
    c = ctx(tmp_path)

    def deadline() -> None:
        raise StepTimeout("past the step's deadline")

    c.check = deadline
    with pytest.raises(StepTimeout):
        _engine(MockSGLang()).sleep_again(c)


def test_a_gate_record_of_another_process_is_refused(tmp_path: Path) -> None:
    _gate(tmp_path, ["weights"], pid=1)
    with pytest.raises(EngineError, match="written by pid 1"):
        _engine(MockSGLang()).sleep_again(ctx(tmp_path))
