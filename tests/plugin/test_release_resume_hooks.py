"""The scheduler's release and resume hooks on fakes of SGLang's weight updater, for what a
CPU server does not do by itself: a tensor SGLang replaced after load (as its rotary cache is
recast on first use on some hosts), a release that fails part way, and a resume of tags that
were never released (an orchestrator compensating a refused release)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import coldsnap.plugin._scheduler as sched
from coldsnap.plugin import ColdsnapMemorySaverAdapter, Settings, StatusFile, StorageRegistry


class Rotary(torch.nn.Module):
    """A layer with a float32 cache that SGLang's rotary recasts to the activation dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(64, 64, dtype=torch.bfloat16))
        self.register_buffer("cos_sin_cache", torch.rand(128, 16), persistent=False)


class Saver:
    """SGLang's memory saver adapter on CPU (a no-op), failing the pause of `fails`."""

    enabled = False

    def __init__(self, fails: str | None = None) -> None:
        self.fails = fails

    def pause(self, tag: str) -> None:
        if tag == self.fails:
            raise RuntimeError(f"pause({tag}) failed")


class Updater:
    """SGLang's release/resume bookkeeping: every asked tag is marked released before any is
    paused (through the memory saver adapter), and a resume removes each asked tag (KeyError
    for one never released)."""

    def __init__(self, adapter: Any = None, fail_release_at: str | None = None) -> None:
        self.tp_cpu_group = None
        self.offload_tags: set[str] = set()
        self.memory_saver_adapter = adapter
        self.fail_release_at = fail_release_at
        self.resumed: list[list[str]] = []

    def release(self, mgr: Updater, req: Any) -> str:
        if self.fail_release_at == "before":
            raise AssertionError("release_memory_occupation should be called only when idle")
        for tag in req.tags:
            self.offload_tags.add(tag)
        if self.fail_release_at == "marked":
            raise RuntimeError("failed between marking and pausing")
        for tag in req.tags:
            self.memory_saver_adapter.pause(tag)
        return "released"

    def resume(self, mgr: Updater, req: Any) -> str:
        for tag in req.tags:
            self.offload_tags.remove(tag)
        self.resumed.append(list(req.tags))
        return "resumed"


def hooks(tmp_path: Path, registry: StorageRegistry | None = None) -> sched.SchedulerHooks:
    settings = Settings(mode="capture", runtime_dir=tmp_path, keep_residual=False)
    status = StatusFile(tmp_path, "scheduler-tp0", {})
    return sched.SchedulerHooks(settings, status, registry or StorageRegistry())


def request(kind: str, tags: list[str]) -> Any:
    from sglang.srt.managers import io_struct

    return getattr(io_struct, f"{kind}MemoryOccupationReqInput")(tags=tags, rid="op1")


@pytest.fixture
def no_tp_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """A single CPU process: no TP group, no NCCL to tear down."""
    monkeypatch.setattr(sched, "_tp_group", lambda: None)
    monkeypatch.setattr(sched._nccl, "prepare", lambda group: None)


def test_a_resume_of_tags_never_released_leaves_the_engine_as_it_serves(
    tmp_path: Path, sglang_cpu: None
) -> None:
    h, mgr = hooks(tmp_path), Updater()
    out = h.around_resume(mgr.resume, mgr, request("Resume", ["weights", "kv_cache"]))
    assert mgr.resumed == []  # SGLang's resume, which would raise KeyError, never ran
    assert type(out).__name__ == "ResumeMemoryOccupationReqOutput"
    record = h.status.record
    assert (record["operation"], record["outcome"], record["error"]) == ("op1", "ok", None)
    assert record["events"][-1]["event"] == "resume_nothing_released"


def test_a_resume_passes_on_only_the_released_tags(tmp_path: Path, sglang_cpu: None) -> None:
    h, mgr = hooks(tmp_path), Updater()
    mgr.offload_tags = {"kv_cache"}
    assert h.around_resume(mgr.resume, mgr, request("Resume", ["weights", "kv_cache"])) == (
        "resumed"
    )
    assert mgr.resumed == [["kv_cache"]] and mgr.offload_tags == set()
    assert h.status.record["outcome"] == "ok"


def test_a_release_registers_the_model_as_it_serves(
    tmp_path: Path, sglang_cpu: None, no_tp_group: None
) -> None:
    model, registry = Rotary(), StorageRegistry()
    registry.register("target", model)
    model.cos_sin_cache = model.cos_sin_cache.to(torch.bfloat16)  # recast on first use
    h = hooks(tmp_path, registry)
    mgr = Updater(adapter(h))
    assert h.around_release(mgr.release, mgr, request("Release", ["kv_cache", "weights"])) == (
        "released"
    )
    record = h.status.record
    assert (record["outcome"], record["error"]) == ("ok", None)
    moved = record["registered"]["target"]["moved"]
    assert len(moved) == 1 and moved[0].startswith("'cos_sin_cache' dtype float32 -> bfloat16")
    registry.get("target").check_live()  # what a resume checks before it hydrates


def adapter(h: sched.SchedulerHooks, fails: str | None = None) -> Any:
    """The plugin's adapter around SGLang's, as the scheduler's create hook makes it."""
    made = ColdsnapMemorySaverAdapter(Saver(fails), live_backing="cpu")
    h.adapters.append(made)
    return made


def test_a_release_that_fails_part_way_keeps_only_what_it_began_to_release(
    tmp_path: Path, sglang_cpu: None, no_tp_group: None
) -> None:
    """SGLang marked kv_cache and weights released, then the weights' pause failed: the
    scheduler lives on, and only kv_cache (paused) and weights (whose pause began) stay
    marked; a resume of both is the compensation."""
    registry = StorageRegistry()
    registry.register("target", Rotary())
    h = hooks(tmp_path, registry)
    mgr = Updater(adapter(h, fails="weights"))
    tags = ["kv_cache", "weights", "cuda_graph"]
    out = h.around_release(mgr.release, mgr, request("Release", tags))
    assert type(out).__name__ == "ReleaseMemoryOccupationReqOutput"  # the scheduler lives on
    record = h.status.record
    assert record["outcome"] == "failed" and "pause(weights) failed" in record["error"]
    assert record["events"][-1]["event"] == "release_failed_part_way"
    assert record["released_tags"] == ["kv_cache", "weights"]  # cuda_graph was never paused
    assert mgr.offload_tags == {"kv_cache", "weights"}


@pytest.mark.parametrize("where", ["before", "marked"])
def test_a_release_that_fails_before_any_pause_is_a_refusal(
    tmp_path: Path, sglang_cpu: None, no_tp_group: None, where: str
) -> None:
    registry = StorageRegistry()
    registry.register("target", Rotary())
    h = hooks(tmp_path, registry)
    mgr = Updater(adapter(h), fail_release_at=where)
    h.around_release(mgr.release, mgr, request("Release", ["kv_cache", "weights"]))
    record = h.status.record
    assert record["outcome"] == "failed"
    # nothing is left marked, and the health gate opens again: the engine serves on
    assert record["events"][-1]["event"] == "release_failed"
    assert record["released_tags"] == [] and mgr.offload_tags == set()


def test_the_unit_fakes_release_and_resume_like_sglang() -> None:
    """The fake's bookkeeping, which the tests above rely on to fail without the hooks'
    care: a resume of a tag never released raises, as SGLang's does."""
    mgr = Updater()
    with pytest.raises(KeyError):
        mgr.resume(mgr, SimpleNamespace(tags=["weights"]))
