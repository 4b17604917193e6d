"""A failed shape calibration fails the capture through Machine as a failed step that
compensates (SGLang's engine steps over a mock transport, the in-memory driver, provider and
store): nothing is released, the engine is stopped, nothing is published. A calibrated capture
binds the published coverage into the capsule's identity (the real store)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from coldsnap._wire import STATUS_FORMAT, STATUS_KIND, status_path
from coldsnap.artifacts import record_digest
from coldsnap.capsules import StoreArtifacts
from coldsnap.engines.sglang import SGLangEngine
from coldsnap.engines.sglang import _steps as engine_steps
from coldsnap.machine import CaptureRequest, InstalledBuild, Machine, ModelRef, WeightSource
from coldsnap.machine import steps as s
from coldsnap.testing import MemoryLauncher, MemoryProcessDriver, MemoryWorld, memory_registry

COVERAGE = {
    "device": "cuda",
    "decode": {"backend": "full", "shapes": [1, 2, 4, 8]},
    "prefill": {"backend": "breakable", "shapes": [256, 512]},
}


class Launcher(MemoryLauncher):
    """The in-memory launcher, with a real runtime directory the engine steps read."""

    def __init__(self, world: MemoryWorld, runtime_dir: Path) -> None:
        super().__init__(world)
        self.runtime_dir = runtime_dir

    def command(
        self, request: Any, workdir: Path, *, weights: WeightSource, runtime_dir: Path | None = None
    ) -> Any:
        return super().command(
            request, workdir, weights=weights, runtime_dir=runtime_dir or self.runtime_dir
        )


class Engine:
    """SGLang's endpoints: every call is recorded; a release writes the scheduler's record."""

    def __init__(self, world: MemoryWorld, runtime_dir: Path, calibration: dict[str, Any]) -> None:
        self.world = world
        self.paths: list[str] = []
        self.runtime_dir = runtime_dir
        self.calibration = calibration
        self.write({"events": []})  # what the scheduler published at start-up

    def write(self, fields: dict[str, Any]) -> None:
        record = {
            "format": STATUS_FORMAT,
            "kind": STATUS_KIND,
            "process": "scheduler-tp0",
            "pid": os.getpid(),
            "role": "scheduler",
            "mode": "capture",
            "registered": {"target": {}},
            "outcome": "ok",
            "error": None,
            "shape_calibration": self.calibration,
            **fields,
        }
        path = status_path(self.runtime_dir, "scheduler-tp0")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = "/" + request.url.path.rsplit("/", 1)[-1]  # under the engine's base URL
        self.paths.append(path)
        if path == "/release_memory_occupation":
            self.write({"events": [{"event": "released", "time": time.time()}]})
            for key, proc in self.world.resources.items():  # what the in-memory driver dumps
                if key.startswith("process:"):
                    proc.update(weights="released", kv="released")
        if path == "/generate":
            return httpx.Response(200, json={"text": "x", "output_ids": [11, 12, 13]})
        return httpx.Response(200, json={"success": True})


def machine(tmp_path: Path, calibration: dict[str, Any]) -> tuple[Any, ...]:
    world = MemoryWorld(cuda=False)
    runtime_dir = tmp_path / "run"
    engine = Engine(world, runtime_dir, calibration)
    request = CaptureRequest(
        driver="n610",
        provider="recovery",  # the engine's export needs a real engine
        model=ModelRef(id="tiny", revision="r1", path=str(_model(tmp_path))),
        workdir=str(tmp_path / "cap"),
        store=str(tmp_path / "store"),
        name="tiny",
    )
    components = memory_registry(world).components(request).by_role()
    components["driver"] = MemoryProcessDriver(world, Launcher(world, runtime_dir), cuda=False)
    components["engine"] = SGLangEngine(
        components["driver"].launcher,
        identity=lambda: InstalledBuild(
            engine="sglang",
            version="0.5.23",
            contract="sha256:" + "0" * 64,
            plugin_digest="sha256:" + "0" * 64,
        ),
        transport=httpx.MockTransport(engine),
    )
    return Machine(**components, dry_run=True), request, world, engine


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    return model


@pytest.fixture(autouse=True)
def memory_pids_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-memory world's pids are not this host's: the engine steps take them as running."""
    monkeypatch.setattr(engine_steps, "running", lambda pid: True)


def test_a_failed_calibration_fails_the_capture_and_compensates(tmp_path: Path) -> None:
    failed = {
        "outcome": "failed",
        "error": "decode graph plan [1, 2, 4, 8] (backend full) differs from the warmed shapes "
        "[1, 2, 4]",
    }
    m, request, world, engine = machine(tmp_path, failed)
    receipt = m.capture(request)
    assert not receipt.ok
    assert receipt.error is not None and "release_memory" in str(receipt.error)
    assert "shape calibration failed: scheduler-tp0: decode graph plan" in str(receipt.error)
    assert "/release_memory_occupation" not in engine.paths  # refused before releasing
    assert "/flush_cache" in engine.paths  # the steps before it ran
    assert world.transient() == frozenset()  # the engine was stopped, nothing leaked
    assert world.capsules == {}  # nothing published
    assert receipt.outcome == "rolled_back" and "comp:driver.stop_engine" in world.calls


def test_a_calibrated_capture_binds_the_coverage_into_the_identity(tmp_path: Path) -> None:
    ok = {"outcome": "ok", "error": None, "coverage": COVERAGE}
    m, request, _, engine = machine(tmp_path, ok)
    adapter = m.components["engine"]
    receipt = m.capture(request)
    assert receipt.ok, receipt.error
    assert "/release_memory_occupation" in engine.paths
    assert receipt.facts[s.SHAPE_COVERAGE.name] == COVERAGE
    # What the real store's seal binds from that fact (the in-memory store seals no identity).
    ctx = SimpleNamespace(request=request, facts=receipt.facts)
    identity = StoreArtifacts(adapter)._identity(ctx, [])
    assert identity.shapes is not None and identity.shapes.decode.shapes == (1, 2, 4, 8)
    assert identity.shapes.prefill.backend == "breakable"
    assert identity.draft is None
    unpublished = StoreArtifacts(adapter)._identity(SimpleNamespace(request=request, facts={}), [])
    assert unpublished.shapes is None
    assert record_digest(unpublished) != record_digest(identity)


def test_a_restored_rank_whose_calibration_failed_is_not_ready() -> None:
    from coldsnap._wire import parse_status
    from coldsnap.engines.sglang._ranks import RankReport

    def rank(**fields: Any) -> RankReport:
        record = {"format": STATUS_FORMAT, "kind": STATUS_KIND, "process": "scheduler-tp0",
                  "pid": 1, "role": "scheduler", "mode": "restore", "outcome": "ok",
                  "registered": {"target": {}}, "events": [], **fields}  # fmt: skip
        return RankReport("scheduler-tp0", 0, 1, True, record, parse_status(record))

    ok = rank(shape_calibration={"outcome": "ok"})
    assert engine_steps._rank_problem(ok, hydrated=False) is None
    failed = {"outcome": "failed", "error": "shape plan decode: captured [1], now [1, 2]"}
    report = rank(shape_calibration=failed)
    assert engine_steps._rank_problem(report, hydrated=False) == (
        "its graph shapes are not the plan: shape plan decode: captured [1], now [1, 2]"
    )
