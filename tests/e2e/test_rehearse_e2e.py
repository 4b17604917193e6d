"""A capture whose refill would answer otherwise is refused before anything is published, on a
real SGLang server and CRIU: n610 native rehearses the restore's refill in its source engine
(step rehearse_refill) and compares the acceptance answer with the one it recorded.

One server start: the capture's own engine. The tests' SGLang plugin (tests/plugin/
sglang_test_plugin) is loaded beside coldsnap's, armed to shift the token embeddings by a row
at the first refill from a payload, which changes every answer (a reload of the checkpoint is
left alone). A subscriber asks the engine every prompt once it is healthy (the cold answers)
and again once release_memory's compensation has given it its checkpoint's weights back, before
the capture's last compensation stops it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from attrs import frozen

from coldsnap import Machine
from coldsnap.artifacts import Store
from coldsnap.machine import JOURNAL_NAME, Receipt, Replay, StepEvent, read_journal

from .conftest import (
    PROMPTS,
    ask_when_healthy,
    capture_request,
    cold_from,
    flushed_answers,
    leftovers,
    model_ref,
    watch,
)

pytestmark = [
    pytest.mark.criu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]

TEST_PLUGIN = Path(__file__).resolve().parents[1] / "plugin" / "sglang_test_plugin"
HYDRATE_FAULT_VAR = "TEST_PLUGIN_HYDRATE_FAULT"  # its fault of a refill from a payload


@frozen
class Refused:
    receipt: Receipt
    cold: list[tuple[int, ...]]
    compensated: list[object]
    fault_left: bool
    store: Path


@pytest.fixture(scope="module")
def refused(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Refused]:
    base = tmp_path_factory.mktemp("rehearse")
    fault = base / "hydrate-fault"
    fault.write_text("armed")
    capture = capture_request(base, model_ref(tiny_llama), "n610", "native", "rehearse")
    cold: list[object] = []
    compensated: list[object] = []

    def after_compensation(event: StepEvent) -> None:
        if (event.step, event.phase) != ("release_memory", "compensated"):
            return
        try:
            facts = Replay.of(read_journal(Path(capture.workdir) / JOURNAL_NAME)).facts
            compensated.append(flushed_answers(facts["engine_url"]))
        except Exception as exc:  # kept and compared by the test, not swallowed
            compensated.append(exc)

    machine = Machine.for_request(
        capture,
        subscribers=[ask_when_healthy(Path(capture.workdir), cold), after_compensation],
    )
    env = machine.components["engine"].launcher.base_env  # the driver launches with it
    env["SGLANG_PLUGINS"] += ",coldsnap_test_plugin"
    env["PYTHONPATH"] = env.get("PYTHONPATH", "") + os.pathsep + str(TEST_PLUGIN)
    env[HYDRATE_FAULT_VAR] = str(fault)
    try:
        receipt = machine.capture(capture)
        yield Refused(receipt, cold_from(cold), compensated, fault.exists(), base / "store")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_capture_is_refused_naming_the_difference(refused: Refused) -> None:
    receipt = refused.receipt
    assert receipt.outcome == "rolled_back", f"{receipt.outcome}: {receipt.error}"
    assert not refused.fault_left, "the test plugin never refilled the engine from a payload"
    error = receipt.error or ""
    assert "rehearse_refill: the engine answers differently after a release and refill" in error
    assert "differ from those recorded at position " in error
    steps = [r.name for r in receipt.steps]
    assert "process_dump" not in steps and "seal_artifact" not in steps


def test_nothing_is_published(refused: Refused) -> None:
    store = Store(refused.store, create=False) if refused.store.exists() else None
    assert store is None or store.tags() == {}
    capsules = refused.store / "capsules"
    assert not capsules.exists() or not any(capsules.iterdir())


def test_the_compensated_engine_answers_as_before_and_is_then_stopped(refused: Refused) -> None:
    assert len(refused.cold) == len(PROMPTS) and all(refused.cold)
    assert refused.compensated == [refused.cold]
    assert not leftovers(*watch(refused.receipt))
