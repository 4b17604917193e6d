"""Both real drivers, both providers, real processes and CRIU, on the toy engine: every restore
answers token for token as a cold start, one capsule restores twice, failures leave nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from coldsnap import Machine
from coldsnap._wire import ResumePlan, write_plan
from coldsnap.backends import Criu
from coldsnap.engines import EngineClient
from coldsnap.testing.toy import TOY_POLICY
from coldsnap.testing.toy_engine import build_toy_model

from ._toy import (
    answers,
    capture_request,
    cold_answers,
    live_engines,
    needs_criu,
    restore_request,
)

pytestmark = [needs_criu, pytest.mark.criu, pytest.mark.xdist_group("toys")]
VARIANTS = [(d, p) for d in ("n610", "n580") for p in ("native", "recovery")]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("toy", numbered=True)


@pytest.fixture(scope="module")
def model(root: Path) -> Path:
    return build_toy_model(root / "model", hidden=1024, layers=8)


@pytest.fixture(scope="module")
def cold(model: Path) -> list[list[int]]:
    return cold_answers(model, 18711)


@pytest.mark.parametrize(("driver", "provider"), VARIANTS)
def test_capture_then_restore_twice_answers_like_a_cold_start(root, model, cold, driver, provider):
    name = f"{driver}-{provider}"
    request = capture_request(root, model, driver, provider, name)
    receipt = Machine.for_request(request).capture(request)
    assert receipt.ok, receipt.error
    assert not live_engines(), "the source was not retired"
    for attempt in range(2):
        restore = restore_request(root, model, driver, provider, name, f"res-{name}-{attempt}")
        machine = Machine.for_request(restore)
        restored = machine.restore(restore)
        assert restored.ok, restored.error
        try:
            assert answers(restored.facts["engine_url"]) == cold
            assert restored.facts["acceptance_tokens"] == receipt.facts["acceptance_tokens"]
        finally:
            machine.stop(restored)
        assert not live_engines()


def test_the_n610_image_leaves_the_weights_out(root, model):
    """The capsule's image against a dump of the same engine with its weights resident."""
    request = capture_request(root, model, "n610", "recovery", "size", keep_source=True)
    machine = Machine.for_request(request)
    receipt = machine.capture(request)
    assert receipt.ok, receipt.error
    weights = sum(p.stat().st_size for p in model.glob("*.safetensors"))
    pid = receipt.facts["engine_pid"]
    try:
        # The kept source has its weights released: resume them from the checkpoint to get the
        # baseline of a whole-process dump that keeps them.
        write_plan(
            Path(receipt.facts["runtime_dir"]),
            ResumePlan(source="checkpoint", checkpoint=str(model)),
        )
        with EngineClient(receipt.facts["engine_url"], TOY_POLICY) as client:
            client.resume(["weights"])
        baseline = Criu().dump(pid, root / "baseline-image", leave_running=False)
    finally:
        machine.components["driver"].processes.stop(pid)
    saved = baseline.image_bytes - receipt.facts["image_bytes"]
    assert saved >= 0.9 * weights, (baseline.image_bytes, receipt.facts["image_bytes"], weights)


def test_a_restore_over_a_live_source_names_the_pid_and_rolls_back(root, model):
    request = capture_request(root, model, "n610", "native", "collide", keep_source=True)
    machine = Machine.for_request(request)
    receipt = machine.capture(request)
    assert receipt.ok, receipt.error
    try:
        restore = restore_request(root, model, "n610", "native", "collide", "res-collide")
        restored = Machine.for_request(restore).restore(restore)
        assert restored.outcome == "rolled_back"
        assert (
            f"PID {receipt.facts['engine_pid']}" in restored.error
            or str(receipt.facts["engine_pid"]) in restored.error
        ), restored.error
        assert "process_restore" in [s.name for s in restored.steps if s.status == "failed"]
    finally:
        machine.components["driver"].processes.stop(receipt.facts["engine_pid"])
    assert not live_engines()
