"""The capture's refill rehearsal on SGLang (SGLangEngine.rehearse_refill) against
httpx.MockTransport: it refills through the plan a restore sends, compares the acceptance
answer with the recorded one, and leaves the engine released again, whether the answers agree
or not; an engine that fails a call fails the step."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from coldsnap._wire import read_plan
from coldsnap.engines import EngineError
from coldsnap.machine import WeightSource
from coldsnap.machine import steps as s

from .test_sglang_steps import TOKENS, MockSGLang, adapter, ctx, measured

PAYLOAD = {"source": "payload", "payload_dir": None, "checkpoint": None,
           "draft_checkpoint": None, "preverified": False}  # fmt: skip
"""The weight source of a native capture: the engine exports on release, no directory yet."""


def _facts(tmp_path: Path, recorded: list[int], **more: object) -> dict[str, object]:
    payload = tmp_path / "payload" / "op-1"
    return {
        s.ACCEPTANCE_TOKENS.name: recorded,
        s.WEIGHT_SOURCE.name: PAYLOAD,
        s.PAYLOAD_DIR.name: str(payload),
        **more,
    }


def _paths(mock: MockSGLang) -> list[str]:
    return [path for _, path, _ in mock.calls]


def test_equal_answers_refill_from_the_export_verified_and_release_again(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path)
    assert adapter(mock).rehearse_refill(ctx(tmp_path, **_facts(tmp_path, TOKENS))) is None
    plan = read_plan(tmp_path)
    assert (plan.source, plan.payload_dir) == ("payload", str(tmp_path / "payload" / "op-1"))
    assert plan.preverified is False, "nothing verified the export yet: the plugin must"
    assert mock.tags("/resume_memory_occupation") == [["weights"], ["kv_cache"]]
    assert mock.tags("/release_memory_occupation") == [["kv_cache", "weights"]]
    paths = _paths(mock)
    # the acceptance request runs from an empty cache, and the snapshot holds no cached prefix
    assert paths.index("/generate") > paths.index("/resume_memory_occupation")
    assert "/flush_cache" in paths[paths.index("/generate") :]
    assert paths[-1] == "/release_memory_occupation"


def test_a_recovery_capture_rehearses_the_checkpoint_reload(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path)
    source = WeightSource(source="checkpoint", checkpoint="/models/m").to_fact()
    facts = {s.ACCEPTANCE_TOKENS.name: TOKENS, s.WEIGHT_SOURCE.name: source}
    adapter(mock).rehearse_refill(ctx(tmp_path, **facts))
    plan = read_plan(tmp_path)
    assert (plan.source, plan.checkpoint) == ("checkpoint", "/models/m")
    assert mock.tags("/release_memory_occupation") == [["kv_cache", "weights"]]


def test_graphs_come_back_with_the_rest_and_are_released_last(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path, report=measured())
    adapter(mock, graphs=True).rehearse_refill(ctx(tmp_path, **_facts(tmp_path, TOKENS)))
    assert mock.tags("/resume_memory_occupation") == [["weights"], ["kv_cache", "cuda_graph"]]
    assert mock.tags("/release_memory_occupation") == [["kv_cache", "weights"], ["cuda_graph"]]


def test_different_answers_refuse_naming_the_position_and_leave_it_released(
    tmp_path: Path,
) -> None:
    mock = MockSGLang(runtime_dir=tmp_path)
    recorded = [TOKENS[0], 99, TOKENS[2]]
    with pytest.raises(EngineError) as caught:
        adapter(mock).rehearse_refill(ctx(tmp_path, **_facts(tmp_path, recorded)))
    message = str(caught.value)
    assert message.startswith("rehearse_refill: the engine answers differently after a release")
    assert "at position 1" in message
    assert str(tmp_path / "payload" / "op-1") in message
    # released again, so that release_memory's compensation reloads the checkpoint
    assert _paths(mock)[-1] == "/release_memory_occupation"
    assert mock.tags("/release_memory_occupation") == [["kv_cache", "weights"]]


def test_a_failed_refill_fails_the_step_and_asks_nothing_more(tmp_path: Path) -> None:
    class Refusing(MockSGLang):
        def __call__(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/resume_memory_occupation":
                self.calls.append((request.method, request.url.path, None))
                return httpx.Response(500, json={"message": "pack tp0/target: block 3 differs"})
            return super().__call__(request)

    mock = Refusing(runtime_dir=tmp_path)
    with pytest.raises(EngineError, match="block 3 differs"):
        adapter(mock).rehearse_refill(ctx(tmp_path, **_facts(tmp_path, TOKENS)))
    assert "/generate" not in _paths(mock)
    assert "/release_memory_occupation" not in _paths(mock)


def test_a_release_again_the_plugin_refused_fails_the_step(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path, outcome="failed")
    with pytest.raises(EngineError, match=r"^rehearse_refill: the release again: .*refused"):
        adapter(mock).rehearse_refill(ctx(tmp_path, **_facts(tmp_path, TOKENS)))


def test_a_payload_capture_without_an_export_is_refused_before_any_call(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path)
    facts = {s.ACCEPTANCE_TOKENS.name: TOKENS, s.WEIGHT_SOURCE.name: PAYLOAD}
    with pytest.raises(EngineError, match="no payload was exported"):
        adapter(mock).rehearse_refill(ctx(tmp_path, **facts))
    assert mock.calls == []
