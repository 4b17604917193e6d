"""A real SGLang server with two tensor-parallel ranks on CPU (gloo), captured and restored
through `Machine` with both drivers and both providers.

For n610 native and recovery and n580 native, one capture at tp=2 and one restore; the restore
answers a fixed prompt set like a cold TP2 start, token for token, and leaves no process behind;
the capsule refuses a restore at tp=1 naming the field. The cold start is the capture's own
engine, started from nothing by the capture's launch command and asked right after it is
healthy, before anything is released (conftest's `ask_when_healthy`, as the architecture
matrix does): a TP2 server start of its own would cost a minute on these hosts, and that the
plugin changes no answer before its release is checked against a plain server in
test_sglang_e2e.py. (n580 recovery is left out to keep `make test` in its time: its restore
is SGLang building a TP2 engine from the checkpoint with its own loader, which the cold start
already does; each provider's per-rank path runs here with a restored tree, n610, and each
driver with a native payload.) Once (n610 native) a rank is killed during a restore: the
restore fails naming that rank and leaves nothing running. Everything runs one after the
other: one server at a time on these 2-core hosts.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from attrs import frozen

from coldsnap import Machine
from coldsnap.machine import RestoreRequest, StepEvent

from .conftest import (
    PROMPTS,
    ask_when_healthy,
    capture_request,
    cold_from,
    flushed_answers,
    leftovers,
    model_ref,
    restore_request,
    stop_at_once,
    watch,
    why,
)

pytestmark = [
    pytest.mark.criu,
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.xdist_group("host"),
]
TP = 2
VARIANTS = [("n610", "native"), ("n610", "recovery"), ("n580", "native")]
KILLED_RANK = 1


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("tp2")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny(tiny_llama: Path) -> Path:
    # conftest's tiny Llama: 4 heads and 2 KV heads, so each rank holds 2 heads and one KV head.
    return tiny_llama


@frozen
class Variant:
    """One TP2 capture of a driver/provider pair and one restore of its capsule."""

    name: str
    capture_tp: int
    payload_ranks: list[str]
    source_left_running: list[str]
    cold: list[tuple[int, ...]]  # the capture's engine, healthy, before anything was released
    answers: list[tuple[int, ...]]
    acceptance_tokens: tuple[list[int], list[int]]
    ranks_reported: dict[str, dict[str, object]]
    left_running: list[str]
    tp1_refusal: str
    killed: str | None
    killed_left_running: list[str]


@pytest.fixture(scope="module", params=VARIANTS, ids=[f"{d}-{p}" for d, p in VARIANTS])
def variant(request: pytest.FixtureRequest, root: Path, tiny: Path) -> Variant:
    driver, provider = request.param
    name = f"{driver}-{provider}"
    base = root / name
    base.mkdir()
    model = model_ref(tiny)
    try:
        capture = capture_request(base, model, driver, provider, name, tp=TP)
        cold: list[object] = []
        subscriber = ask_when_healthy(Path(capture.workdir), cold)
        receipt = Machine.for_request(capture, subscribers=[subscriber]).capture(capture)
        assert receipt.ok, why(receipt)
        reference = cold_from(cold)
        dirs, pids = watch(receipt)
        source_left = leftovers(dirs, pids)
        payload_ranks = _payload_ranks(Path(capture.store), receipt.facts["capsule_digest"])

        refusal = restore_request(base, model, driver, provider, name, "res-tp1")
        refusal = RestoreRequest(**{**_fields(refusal), "tp": 1})
        refused = Machine.for_request(refusal).restore(refusal)
        assert not refused.ok, "a TP2 capsule restored at tp=1"

        restore = restore_request(base, model, driver, provider, name, "res-0")
        machine = Machine.for_request(restore)
        restored = machine.restore(restore)
        assert restored.ok, why(restored)
        more_dirs, more_pids = watch(restored)
        dirs, pids = dirs | more_dirs, pids | more_pids
        try:
            got = flushed_answers(restored.facts["engine_url"])
        finally:  # n610 native's stop is the graceful one; recovery's is the same restored tree
            if name == "n610-recovery":
                stop_at_once(machine, restored)
            else:
                machine.stop(restored)
        killed, killed_left = None, []
        if name == "n610-native":
            killed, killed_left = _restore_killing_a_rank(base, model, name, receipt.facts)
        return Variant(
            name=name,
            capture_tp=receipt.facts["tp_size"],
            payload_ranks=payload_ranks,
            source_left_running=source_left,
            cold=reference,
            answers=got,
            acceptance_tokens=(
                receipt.facts["acceptance_tokens"],
                restored.facts["acceptance_tokens"],
            ),
            ranks_reported=restored.facts.get("tp_ranks") or {},
            left_running=leftovers(dirs, pids),
            tp1_refusal=refused.error or "",
            killed=killed,
            killed_left_running=killed_left,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _payload_ranks(store: Path, digest: str) -> list[str]:
    """The ranks whose packs the capsule's payload holds (`tp<rank>/<role>/...` members)."""
    from coldsnap.artifacts import Store

    members = Store(store).capsule(digest).by_role("payload")
    return sorted({m.name.removeprefix("payload/").split("/")[0] for m in members})


def _fields(request: RestoreRequest) -> dict[str, object]:
    import attrs

    return {f.name: getattr(request, f.name) for f in attrs.fields(RestoreRequest)}


def _restore_killing_a_rank(
    base: Path, model: object, name: str, captured: dict[str, object]
) -> tuple[str, list[str]]:
    """A restore during which rank KILLED_RANK is killed (SIGKILL) once CRIU has restored the
    tree: its error, and what it left running."""
    runtime_dir = Path(str(captured["runtime_dir"]))
    victim = captured["rank_pids"][f"scheduler-tp{KILLED_RANK}"]  # type: ignore[index]
    restore = restore_request(base, model, "n610", "native", name, "res-killed")  # type: ignore[arg-type]
    machine = Machine.for_request(restore)

    def kill_after_restore(event: StepEvent) -> None:
        if event.step == "ranks_present" and event.phase == "started":
            os.kill(victim, signal.SIGKILL)

    machine.subscribe(kill_after_restore)
    receipt = machine.restore(restore)
    assert not receipt.ok, "the restore succeeded although a rank was killed"
    dirs, pids = watch(receipt)
    return receipt.error or "", leftovers(dirs | {str(runtime_dir)}, pids)


def test_a_tp2_restore_answers_like_a_cold_tp2_start(variant: Variant) -> None:
    assert variant.capture_tp == TP
    assert not variant.source_left_running, "the capture's source was not retired"
    assert len(variant.cold) == len(PROMPTS) and all(variant.cold)
    assert variant.answers == variant.cold
    captured, restored = variant.acceptance_tokens
    assert restored == captured
    assert not variant.left_running, variant.left_running


def test_every_rank_exports_and_reports_its_own_shard(variant: Variant) -> None:
    if variant.name.endswith("native"):
        assert variant.payload_ranks == ["tp0", "tp1"]
    assert sorted(variant.ranks_reported) == ["scheduler-tp0", "scheduler-tp1"]
    if variant.name.startswith("n610"):
        # The restored ranks all-reduce over gloo connections CRIU brought back as they were
        # (--tcp-established): no NCCL to rebuild on CPU, which each rank recorded at resume.
        for rank in variant.ranks_reported.values():
            nccl = rank["nccl"]
            assert isinstance(nccl, dict) and nccl["nccl"] == "noop", rank
            assert "gloo" in str(nccl["reason"]), rank


def test_a_tp2_capsule_refuses_a_tp1_restore_naming_the_field(variant: Variant) -> None:
    assert "tp: expected 2, found 1" in variant.tp1_refusal, variant.tp1_refusal


def test_a_rank_killed_during_a_restore_is_named_and_nothing_is_left(variant: Variant) -> None:
    if variant.killed is None:
        pytest.skip("the killed-rank restore runs once, on the n610 native capsule")
    assert f"rank {KILLED_RANK} (scheduler-tp{KILLED_RANK}" in variant.killed, variant.killed
    assert "is not running" in variant.killed
    assert not variant.killed_left_running, variant.killed_left_running
