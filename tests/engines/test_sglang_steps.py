"""SGLang's machine-side steps against httpx.MockTransport: each step calls the endpoints it
should, writes the plugin's files, and returns only the facts its shared step makes."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psutil
import pytest

from coldsnap._wire import PLAN_FILE, PlanError, read_plan
from coldsnap.engines import EngineError
from coldsnap.engines.sglang import SGLangEngine, SGLangLauncher, register
from coldsnap.machine import Engine, Registry
from coldsnap.machine import steps as s

ENGINE_STEPS = {
    step.action.split(".", 1)[1]: step
    for step in vars(s).values()
    if isinstance(step, s.Step) and step.action.startswith("engine.")
}
TOKENS = [11, 12, 13]


class MockSGLang:
    """A mock SGLang: records (method, path, body) and answers like the real endpoints."""

    def __init__(self, ready: int = 200) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.ready = ready

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.method, request.url.path, body))
        if request.url.path == "/ready":
            return httpx.Response(self.ready)
        if request.url.path == "/generate":
            return httpx.Response(200, json={"text": "x", "output_ids": TOKENS})
        return httpx.Response(200, json={"success": True})

    def tags(self, path: str) -> list[list[str]]:
        return [body["tags"] for _, p, body in self.calls if p == path]


def ctx(tmp_path: Path, **facts: Any) -> Any:
    base = {
        s.ENGINE_URL.name: "http://engine",
        s.ENGINE_PID.name: os.getpid(),
        s.RUNTIME_DIR.name: str(tmp_path),
    }
    return SimpleNamespace(
        facts={**base, **facts},
        request=SimpleNamespace(model=SimpleNamespace(path="/models/m")),
        check=lambda: None,
    )


def adapter(mock: MockSGLang, *, graphs: bool = False) -> SGLangEngine:
    return SGLangEngine(
        SGLangLauncher(),
        graphs=graphs,
        identity=lambda: ("sglang", "0", "sha256:x"),
        transport=httpx.MockTransport(mock),
    )


def test_it_is_an_engine_with_capabilities_not_names() -> None:
    assert isinstance(adapter(MockSGLang()), Engine)
    assert adapter(MockSGLang()).capabilities == frozenset()
    assert adapter(MockSGLang(), graphs=True).capabilities == frozenset({"cuda_graphs"})
    assert adapter(MockSGLang()).build() == ("sglang", "0", "sha256:x")


@pytest.mark.parametrize("graphs", [False, True])
def test_each_step_returns_only_what_its_step_makes(tmp_path: Path, graphs: bool) -> None:
    mock = MockSGLang()
    engine = adapter(mock, graphs=graphs)
    source = {"provider": "recovery", "checkpoint": "/models/m"}
    c = ctx(
        tmp_path,
        **{s.CAPSULE.name: {s.ACCEPTANCE_TOKENS.name: TOKENS}, s.WEIGHT_SOURCE.name: source},
    )
    for method, step in ENGINE_STEPS.items():
        made = getattr(engine, method)(c) or {}
        assert set(made) <= {f.name for f in step.makes}, method
        assert set(made) == {f.name for f in step.makes}, f"{method} makes less than declared"
    for compensation in ("resume_memory", "recapture_graphs"):
        assert getattr(engine, compensation)(c) is None


def test_release_names_the_tags_and_the_export_dir(tmp_path: Path) -> None:
    mock = MockSGLang()
    made = adapter(mock).release_memory(ctx(tmp_path))
    assert made == {s.EXPORT_DIR.name: str(tmp_path / "payload")}
    assert mock.tags("/release_memory_occupation") == [["kv_cache", "weights"]]


@pytest.mark.parametrize(
    ("graphs", "rest"), [(False, ["kv_cache"]), (True, ["kv_cache", "cuda_graph"])]
)
def test_resume_rest_resumes_graphs_only_where_there_are(
    tmp_path: Path, graphs: bool, rest: list[str]
) -> None:
    mock = MockSGLang()
    adapter(mock, graphs=graphs).resume_rest(ctx(tmp_path))
    assert mock.tags("/resume_memory_occupation") == [rest]


@pytest.mark.parametrize(
    "source",
    [
        {"provider": "native", "payload_dir": "/capsule/payload", "preverified": True},
        {"provider": "recovery", "checkpoint": "/models/m"},
    ],
)
def test_resume_weights_writes_the_weight_source_as_the_plan(
    tmp_path: Path, source: dict[str, Any]
) -> None:
    mock = MockSGLang()
    made = adapter(mock).resume_weights(ctx(tmp_path, **{s.WEIGHT_SOURCE.name: source}))
    plan = read_plan(tmp_path)
    assert {k: getattr(plan, k) for k in source} == source
    assert plan.seed == made[s.RESUME_SEED.name]
    assert mock.tags("/resume_memory_occupation") == [["weights"]]


def test_a_malformed_weight_source_is_refused_before_any_call(tmp_path: Path) -> None:
    mock = MockSGLang()
    source = {"provider": "native", "payload_dir": "/p", "pack": "extra"}
    with pytest.raises(PlanError, match="pack"):
        adapter(mock).resume_weights(ctx(tmp_path, **{s.WEIGHT_SOURCE.name: source}))
    assert mock.calls == [] and not (tmp_path / PLAN_FILE).exists()


def test_wait_healthy_falls_back_to_health_without_ready(tmp_path: Path) -> None:
    mock = MockSGLang(ready=404)
    made = adapter(mock).wait_healthy(ctx(tmp_path))
    assert made[s.HEALTHY_AFTER_S.name] >= 0
    assert [p for _, p, _ in mock.calls] == ["/ready", "/health"]


def test_wait_healthy_fails_at_once_with_the_log_when_the_engine_ended(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("Traceback ...\nRuntimeError: out of memory\n")
    ended = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(ended.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        mock = MockSGLang(ready=503)
        c = ctx(tmp_path, **{s.ENGINE_PID.name: ended.pid, s.ENGINE_LOG.name: str(log)})
        started = time.monotonic()
        with pytest.raises(EngineError, match=r"(?s)ended before it was ready.*out of memory"):
            adapter(mock).wait_healthy(c)
        assert time.monotonic() - started < 5
    finally:
        ended.wait()


def test_acceptance_compares_with_the_capsule(tmp_path: Path) -> None:
    engine = adapter(MockSGLang())
    c = ctx(tmp_path, **{s.CAPSULE.name: {s.ACCEPTANCE_TOKENS.name: [11, 12, 99]}})
    with pytest.raises(EngineError, match="position 2"):
        engine.check_acceptance(c)
    with pytest.raises(EngineError, match="no acceptance tokens"):
        engine.check_acceptance(ctx(tmp_path, **{s.CAPSULE.name: {}}))


def test_register_adds_engine_sglang() -> None:
    registry = Registry(entry_points=False)
    register(registry)
    assert registry.names("engine") == ("sglang",)
