"""A capture whose ranks publish no shape calibration, or publish shapes that disagree, is
refused before anything is released or sealed, naming the ranks (SGLang's engine steps over a
mock transport, the in-memory driver, provider and store, real status records): the release
is never asked for, the compensation's resume finds nothing released, nothing is published.
An engine without rank reports (the toy engine's case) still captures without shapes."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from coldsnap._wire import STATUS_FORMAT, STATUS_KIND, status_path
from coldsnap.engines.sglang import SGLangEngine
from coldsnap.engines.sglang import _steps as engine_steps
from coldsnap.machine import CaptureRequest, InstalledBuild, Machine, ModelRef, WeightSource
from coldsnap.machine import steps as s
from coldsnap.testing import MemoryLauncher, MemoryProcessDriver, MemoryWorld, memory_registry

CUDA_SHAPES = {
    "device": "cuda",
    "decode": {"backend": "full", "shapes": [1, 2, 4, 8]},
    "prefill": {"backend": "disabled", "shapes": []},
}
FEWER_SHAPES = {**CUDA_SHAPES, "decode": {"backend": "full", "shapes": [1, 2, 4]}}


def calibrated(coverage: dict[str, Any]) -> dict[str, Any]:
    return {"outcome": "ok", "error": None, "coverage": coverage}


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
    """SGLang's endpoints over a mock transport; each rank's status record says what it
    calibrated at start-up (None: published nothing), and a release marks every rank
    released, as the plugin's records would."""

    def __init__(
        self,
        runtime_dir: Path,
        calibrations: list[dict[str, Any] | None],
        world: MemoryWorld | None = None,
        *,
        deferred: bool = False,
    ) -> None:
        self.world = world
        self.paths: list[str] = []
        self.runtime_dir = runtime_dir
        self.calibrations = calibrations
        self.deferred = deferred  # decode graphs pending (async_cuda_graphs): not calibrated yet
        self.write(events=[])

    def write(self, *, events: list[dict[str, Any]]) -> None:
        for rank, calibration in enumerate(self.calibrations):
            record = {
                "format": STATUS_FORMAT,
                "kind": STATUS_KIND,
                "process": f"scheduler-tp{rank}",
                "pid": os.getpid(),
                "role": "scheduler",
                "mode": "capture",
                "tp_rank": rank,
                "tp_size": len(self.calibrations),
                "registered": {"target": {}},
                "outcome": "ok",
                "error": None,
                "events": events,
                "shape_calibration": None if self.deferred else calibration,
                "async_decode_graph": "pending" if self.deferred else None,
            }
            path = status_path(self.runtime_dir, f"scheduler-tp{rank}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = "/" + request.url.path.rsplit("/", 1)[-1]  # under the engine's base URL
        self.paths.append(path)
        if path == "/release_memory_occupation":
            self.write(events=[{"event": "released", "time": time.time()}])
            for key, proc in self.world.resources.items() if self.world else ():
                if key.startswith("process:"):  # what the in-memory driver dumps
                    proc.update(weights="released", kv="released")
        if path == "/generate":
            return httpx.Response(200, json={"text": "x", "output_ids": [11, 12, 13]})
        return httpx.Response(200, json={"success": True})


def capture(
    tmp_path: Path,
    calibrations: list[dict[str, Any] | None],
    *,
    rank_reports: bool = True,
    deferred_for: float | None = None,
    release_timeout: float = 120.0,
) -> tuple[Any, MemoryWorld, Engine]:
    world = MemoryWorld(cuda=False)
    runtime_dir = tmp_path / "run"
    engine = Engine(runtime_dir, calibrations, world, deferred=deferred_for is not None)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    request = CaptureRequest(
        driver="n610",
        provider="recovery",
        model=ModelRef(id="tiny", revision="r1", path=str(model)),
        workdir=str(tmp_path / "cap"),
        store=str(tmp_path / "store"),
        name="tiny",
        tp=len(calibrations),
        timeouts={"release_memory": release_timeout},
    )
    components = memory_registry(world).components(request).by_role()
    components["driver"] = MemoryProcessDriver(world, Launcher(world, runtime_dir), cuda=False)
    components["engine"] = SGLangEngine(
        components["driver"].launcher,
        rank_reports=rank_reports,
        identity=lambda: InstalledBuild(
            engine="sglang",
            version="0.5.23",
            contract="sha256:" + "0" * 64,
            plugin_digest="sha256:" + "0" * 64,
        ),
        transport=httpx.MockTransport(engine),
    )
    if deferred_for is not None and deferred_for != float("inf"):
        # the ranks capture their decode graphs and calibrate at idle, a little later
        def calibrate_at_idle() -> None:
            engine.deferred = False
            engine.write(events=[])

        timer = threading.Timer(deferred_for, calibrate_at_idle)
        timer.start()
    receipt = Machine(**components, dry_run=True).capture(request)
    return receipt, world, engine


@pytest.fixture(autouse=True)
def memory_pids_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-memory world's pids are not this host's: the engine steps take them as running."""
    monkeypatch.setattr(engine_steps, "running", lambda pid: True)


def assert_refused_before_release(receipt: Any, world: MemoryWorld, engine: Engine) -> str:
    assert receipt.outcome == "rolled_back", receipt.error
    assert receipt.failure is not None and receipt.failure.step == "release_memory"
    assert "/release_memory_occupation" not in engine.paths  # nothing was released
    # The release step's own compensation asks for a resume, which the plugin answers with
    # "nothing released" (it resumes only what it released): the engine serves as it was
    # until the capture's launch is undone.
    assert engine.paths[-1] == "/resume_memory_occupation"
    assert world.capsules == {}  # nothing sealed
    assert world.transient() == frozenset()  # the engine was stopped, nothing leaked
    return receipt.failure.message


def test_no_rank_publishing_a_calibration_refuses_naming_every_rank(tmp_path: Path) -> None:
    receipt, world, engine = capture(tmp_path, [None, None])
    message = assert_refused_before_release(receipt, world, engine)
    assert "no shape calibration published by scheduler-tp0, scheduler-tp1" in message


def test_one_rank_without_a_calibration_is_named(tmp_path: Path) -> None:
    receipt, world, engine = capture(tmp_path, [calibrated(CUDA_SHAPES), None])
    message = assert_refused_before_release(receipt, world, engine)
    assert "no shape calibration published by scheduler-tp1:" in message
    assert "scheduler-tp0" not in message


def test_ranks_that_publish_different_shapes_are_named_with_theirs(tmp_path: Path) -> None:
    receipt, world, engine = capture(
        tmp_path, [calibrated(CUDA_SHAPES), calibrated(FEWER_SHAPES), calibrated(CUDA_SHAPES)]
    )
    message = assert_refused_before_release(receipt, world, engine)
    assert message.startswith("release_memory: the ranks published different graph shapes: ")
    assert "scheduler-tp0 and scheduler-tp2: " in message
    assert "scheduler-tp1: " in message and "[1, 2, 4]" in message


def test_a_rank_without_a_status_record_is_named(tmp_path: Path) -> None:
    runtime_dir = tmp_path / "run"
    Engine(runtime_dir, [calibrated(CUDA_SHAPES)])  # rank 0 only, where the request asks two
    assert engine_steps._shape_coverage(runtime_dir, 1, required=True) == CUDA_SHAPES
    with pytest.raises(engine_steps.EngineError, match=r"by scheduler-tp1 \(no status record\)"):
        engine_steps._shape_coverage(runtime_dir, 2, required=True)


def test_agreeing_ranks_bind_their_shapes(tmp_path: Path) -> None:
    receipt, _, engine = capture(tmp_path, [calibrated(CUDA_SHAPES), calibrated(CUDA_SHAPES)])
    assert receipt.ok, receipt.error
    assert "/release_memory_occupation" in engine.paths
    assert receipt.facts[s.SHAPE_COVERAGE.name] == CUDA_SHAPES


def test_an_engine_without_rank_reports_captures_without_shapes(tmp_path: Path) -> None:
    receipt, _, engine = capture(tmp_path, [None], rank_reports=False)
    assert receipt.ok, receipt.error
    assert "/release_memory_occupation" in engine.paths
    assert receipt.facts[s.SHAPE_COVERAGE.name] is None


def test_the_release_waits_for_graphs_deferred_to_the_first_idle(tmp_path: Path) -> None:
    """A capture with async_cuda_graphs: each rank calibrates once it has captured its decode
    graphs at idle, which may come after the requests before the release were answered."""
    shapes = [calibrated(CUDA_SHAPES), calibrated(CUDA_SHAPES)]
    receipt, _, engine = capture(tmp_path, shapes, deferred_for=0.5)
    assert receipt.ok, receipt.error
    assert receipt.facts[s.SHAPE_COVERAGE.name] == CUDA_SHAPES
    assert "/release_memory_occupation" in engine.paths


def test_graphs_still_deferred_at_the_deadline_are_named(tmp_path: Path) -> None:
    shapes = [calibrated(CUDA_SHAPES), calibrated(CUDA_SHAPES)]
    receipt, world, engine = capture(
        tmp_path, shapes, deferred_for=float("inf"), release_timeout=1.0
    )
    message = assert_refused_before_release(receipt, world, engine)
    assert "the decode graphs of scheduler-tp0, scheduler-tp1 are still deferred" in message
