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

from coldsnap._errors import DefinitionError
from coldsnap._wire import (
    PLAN_FILE,
    STATUS_FORMAT,
    STATUS_KIND,
    PlanError,
    read_plan,
    status_path,
)
from coldsnap.engines import EngineError
from coldsnap.engines.sglang import GRAPH_SAVER_ENV, SGLangEngine, SGLangLauncher, register
from coldsnap.machine import Engine, InstalledBuild, Registry
from coldsnap.machine import steps as s

ENGINE_STEPS = {
    step.action.split(".", 1)[1]: step
    for step in vars(s).values()
    if isinstance(step, s.Step) and step.action.startswith("engine.")
}
TOKENS = [11, 12, 13]


GIB = 2**30


def measured(**resident: int) -> dict[str, Any]:
    """The plugin's measurement of a release on cuda:0 (coldsnap.plugin._cuda_release)."""
    regions = {"weights": 2 * GIB, "kv_cache": 40 * GIB}
    return {
        "device": "cuda:0",
        "tags": ["kv_cache", "weights"],
        "regions": {
            t: {"bytes": n, "resident_bytes": resident.get(t, 0), "tensors": 3}
            for t, n in regions.items()
        },
        "resident": {t: n for t, n in resident.items() if n},
        "device_used_before": 44 * GIB,
        "device_used_after": 44 * GIB if resident else GIB + 5,
        "device_used_released": 44 * GIB if resident else GIB + 5,
        "device_freed": 0 if resident else 43 * GIB - 5,
        "residual_device_bytes": 44 * GIB if resident else GIB + 5,
        "error": None,
    }


class MockSGLang:
    """A mock SGLang: records (method, path, body) and answers like the real endpoints. With
    `runtime_dir` and `report`, each release writes the schedulers' status records as the
    plugin does (`report` is the cuda_release field of each; `outcome` their outcome)."""

    def __init__(
        self,
        ready: int = 200,
        *,
        runtime_dir: Path | None = None,
        report: dict[str, Any] | None = None,
        ranks: int = 1,
        outcome: str = "ok",
    ) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.ready = ready
        self.runtime_dir = runtime_dir
        self.report = report
        self.ranks = ranks
        self.outcome = outcome

    def _write_status(self, tags: list[str]) -> None:
        assert self.runtime_dir is not None
        for rank in range(self.ranks):
            record: dict[str, Any] = {
                "format": STATUS_FORMAT,
                "kind": STATUS_KIND,
                "process": f"scheduler-tp{rank}",
                "pid": os.getpid(),
                "role": "scheduler",
                "mode": "capture",
                "registered": {"target": {}},
                "events": [{"event": "released", "time": time.time()}],
                "outcome": self.outcome,
                "error": None if self.outcome == "ok" else "RuntimeError: export failed",
            }
            if self.report is not None:
                record["cuda_release"] = {**self.report, "tags": tags, "at": time.time()}
            path = status_path(self.runtime_dir, f"scheduler-tp{rank}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.method, request.url.path, body))
        if request.url.path == "/release_memory_occupation" and self.runtime_dir is not None:
            self._write_status(list((body or {}).get("tags") or []))
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
        request=SimpleNamespace(
            model=SimpleNamespace(path="/models/m"),
            provider="recovery",
            workdir=str(tmp_path),
            engine_args=(),
        ),
        check=lambda: None,
    )


def adapter(mock: MockSGLang, *, graphs: bool = False, cuda: bool = False) -> SGLangEngine:
    env = {GRAPH_SAVER_ENV: "1"} if graphs else {}
    return SGLangEngine(
        SGLangLauncher((), env),
        graphs=graphs,
        cuda=cuda or graphs,
        identity=lambda: InstalledBuild(
            engine="sglang", version="0", contract="sha256:x", plugin_digest="sha256:x"
        ),
        transport=httpx.MockTransport(mock),
    )


def test_it_is_an_engine_with_capabilities_not_names() -> None:
    assert isinstance(adapter(MockSGLang()), Engine)
    assert adapter(MockSGLang()).capabilities == frozenset()
    assert adapter(MockSGLang(), graphs=True).capabilities == frozenset({"cuda_graphs"})
    assert adapter(MockSGLang()).build().contract == "sha256:x"


@pytest.mark.parametrize("graphs", [False, True])
def test_each_step_returns_only_what_its_step_makes(tmp_path: Path, graphs: bool) -> None:
    mock = MockSGLang(runtime_dir=tmp_path, report=measured())
    engine = adapter(mock, graphs=graphs)
    source = {"source": "checkpoint", "checkpoint": "/models/m"}
    capsule = {
        s.ACCEPTANCE_TOKENS.name: TOKENS,
        s.TP_SIZE.name: 1,
        s.RANK_PIDS.name: {"scheduler-tp0": os.getpid()},
    }
    facts = {s.CAPSULE.name: capsule, s.WEIGHT_SOURCE.name: source}
    c = ctx(tmp_path, **facts, **{s.ACCEPTANCE_TOKENS.name: TOKENS})
    for method, step in ENGINE_STEPS.items():
        made = getattr(engine, method)(c) or {}
        assert set(made) <= {f.name for f in step.makes}, method
        assert set(made) == {f.name for f in step.makes}, f"{method} makes less than declared"
    for compensation in ("resume_memory", "recapture_graphs"):
        assert getattr(engine, compensation)(c) is None


def test_release_names_the_tags_and_the_export_dir(tmp_path: Path) -> None:
    mock = MockSGLang()
    made = adapter(mock).release_memory(ctx(tmp_path))
    assert made == {
        s.EXPORT_DIR.name: str(tmp_path / "payload"),
        s.RESIDUAL_DEVICE_BYTES.name: 0,
        s.TP_SIZE.name: 1,
        s.RANK_PIDS.name: {},
        s.SHAPE_COVERAGE.name: None,  # no scheduler published one
    }
    assert mock.tags("/release_memory_occupation") == [["kv_cache", "weights"]]


def test_a_cuda_release_makes_the_residual_summed_over_ranks(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path, report=measured(), ranks=2)
    made = adapter(mock, cuda=True).release_memory(ctx(tmp_path))
    assert made[s.RESIDUAL_DEVICE_BYTES.name] == 2 * (GIB + 5)


@pytest.mark.parametrize("cuda", [False, True])
def test_a_release_that_leaves_weights_or_kv_resident_is_refused_naming_them(
    tmp_path: Path, cuda: bool
) -> None:
    """The memory saver off: SGLang's release returns, nothing left the device."""
    mock = MockSGLang(runtime_dir=tmp_path, report=measured(weights=2 * GIB, kv_cache=40 * GIB))
    with pytest.raises(EngineError) as err:
        adapter(mock, cuda=cuda).release_memory(ctx(tmp_path))
    text = str(err.value)
    assert "scheduler-tp0 (cuda:0): still resident after the release" in text
    assert f"kv_cache {40 * GIB} B (40.000 GiB) of {40 * GIB} B" in text
    assert f"weights {2 * GIB} B (2.000 GiB) of {2 * GIB} B" in text
    assert "freed 0 B" in text
    assert ("--enable-memory-saver" in text) is cuda


def test_a_partly_resident_region_is_refused_too(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path, report=measured(kv_cache=4096))
    with pytest.raises(EngineError, match=r"kv_cache 4096 B \(0.000 GiB\) of"):
        adapter(mock, cuda=True).release_memory(ctx(tmp_path))


def test_a_cuda_release_nobody_measured_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="no scheduler status record"):
        adapter(MockSGLang(), cuda=True).release_memory(ctx(tmp_path))
    mock = MockSGLang(runtime_dir=tmp_path, report=None)
    with pytest.raises(EngineError, match="scheduler-tp0: no measurement of this release"):
        adapter(mock, cuda=True).release_memory(ctx(tmp_path))


def test_a_stale_measurement_is_not_taken_for_this_release(tmp_path: Path) -> None:
    old = {**measured(), "at": time.time() - 60}
    path = status_path(tmp_path, "scheduler-tp0")
    path.parent.mkdir(parents=True)
    record = {"format": STATUS_FORMAT, "kind": STATUS_KIND, "process": "scheduler-tp0", "pid": 1,
              "role": "scheduler", "mode": "capture", "cuda_release": old}  # fmt: skip
    path.write_text(json.dumps(record))
    with pytest.raises(EngineError, match="no measurement of this release"):
        adapter(MockSGLang(), cuda=True).release_memory(ctx(tmp_path))


def test_a_measurement_error_or_a_cpu_measurement_on_cuda_is_refused(tmp_path: Path) -> None:
    report = {**measured(), "error": "found no device tensors of region(s) kv_cache to check"}
    mock = MockSGLang(runtime_dir=tmp_path, report=report)
    with pytest.raises(EngineError, match="could not be measured: found no device tensors"):
        adapter(mock, cuda=True).release_memory(ctx(tmp_path))
    mock = MockSGLang(runtime_dir=tmp_path, report={**measured(), "device": "cpu"})
    with pytest.raises(EngineError, match="measured on cpu, but this engine runs on CUDA"):
        adapter(mock, cuda=True).release_memory(ctx(tmp_path))


def test_a_release_the_plugin_refused_fails_the_step(tmp_path: Path) -> None:
    mock = MockSGLang(runtime_dir=tmp_path, report=None, outcome="failed")
    with pytest.raises(EngineError, match="the plugin refused the release: RuntimeError: export"):
        adapter(mock).release_memory(ctx(tmp_path))


def test_graphs_only_with_the_graph_saver_on_cuda() -> None:
    """Without SGLANG_MEMORY_SAVER_CUDA_GRAPH=1 releasing cuda_graph frees nothing: no graph
    step may be selected (capability cuda_graphs) for it."""
    with pytest.raises(DefinitionError, match="SGLANG_MEMORY_SAVER_CUDA_GRAPH=1"):
        SGLangEngine(SGLangLauncher(), graphs=True, cuda=True)
    with pytest.raises(DefinitionError, match="needs cuda=True"):
        SGLangEngine(SGLangLauncher((), {GRAPH_SAVER_ENV: "1"}), graphs=True)
    engine = SGLangEngine(SGLangLauncher(), cuda=True)
    assert engine.capabilities == frozenset()


@pytest.mark.parametrize("saver", [None, "0", "1"])
def test_build_on_cuda_runs_the_memory_saver_and_claims_graphs_only_with_the_option(
    monkeypatch: pytest.MonkeyPatch, saver: str | None
) -> None:
    import coldsnap.engines.sglang as adapter
    from coldsnap.engines.sglang import build

    monkeypatch.setattr(adapter, "cuda_host", lambda: True)
    monkeypatch.setenv(GRAPH_SAVER_ENV, "1")  # the orchestrator's own: it decides nothing
    options = {} if saver is None else {"cuda_graphs_in_saver": saver}
    engine = build(SimpleNamespace(engine_options=options))
    assert engine.cuda is True
    assert "--enable-memory-saver" in engine.launcher.base_args
    assert engine.graphs is (saver == "1")
    assert engine.launcher.base_env[GRAPH_SAVER_ENV] == ("1" if saver == "1" else "0")
    ranks = frozenset({"rank_reports"})
    assert engine.capabilities == (frozenset({"cuda_graphs"}) | ranks if saver == "1" else ranks)
    prefill_off = "--cuda-graph-backend-prefill" in engine.launcher.base_args
    assert prefill_off is (saver == "1")


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
        {"source": "payload", "payload_dir": "/capsule/payload", "preverified": True},
        {"source": "checkpoint", "checkpoint": "/models/m"},
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
    source = {"source": "payload", "payload_dir": "/p", "pack": "extra"}
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


def test_a_cuda_hosts_template_imports_no_sglang_module() -> None:
    """On CUDA an n580 template gets only the context-free preload (SGLang's own imports create
    a device context there), for the template and its forkserver alike."""
    from coldsnap.engines.sglang import CUDA_TEMPLATE_PRELOAD, SGLangLauncher

    assert not [m for m in CUDA_TEMPLATE_PRELOAD if m.split(".")[0] == "sglang"]
    launcher = SGLangLauncher(context_free_preload=CUDA_TEMPLATE_PRELOAD)
    assert launcher.template_preload == CUDA_TEMPLATE_PRELOAD
    assert launcher.forkserver_preload == CUDA_TEMPLATE_PRELOAD
    default = SGLangLauncher()
    assert "sglang.launch_server" in default.template_preload
