"""Scheduler-side hooks on fakes, for the paths a CPU server cannot run: a draft model's
recovery path and async decode-graph capture (shape calibration: test_calibration.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import coldsnap.plugin._scheduler as sched
from coldsnap._wire import ResumePlan, write_plan
from coldsnap.plugin import Settings, StatusFile, StorageRegistry


def hooks(tmp_path: Path, **settings: Any) -> sched.SchedulerHooks:
    s = Settings(mode="capture", runtime_dir=tmp_path, **settings)
    return sched.SchedulerHooks(s, StatusFile(tmp_path, "scheduler-tp0", {}), StorageRegistry())


def updater(is_draft: bool) -> Any:
    runner = SimpleNamespace(is_draft_worker=is_draft)
    return SimpleNamespace(get_model_runner=lambda: runner)


def test_draft_model_recovers_from_its_own_path(tmp_path: Path) -> None:
    h = hooks(tmp_path)
    write_plan(
        tmp_path,
        ResumePlan(source="checkpoint", checkpoint="/ckpt/target", draft_checkpoint="/ckpt/draft"),
    )
    seen: list[str] = []

    def original(upd: Any, model_path: str, load_format: str) -> tuple[bool, str]:
        seen.append(model_path)
        return True, "ok"

    h.around_runner_update_from_disk(original, updater(True), "/ckpt/target", "auto")
    h.around_runner_update_from_disk(original, updater(False), "/ckpt/target", "auto")
    assert seen == ["/ckpt/draft", "/ckpt/target"]


def test_without_a_plan_update_from_disk_is_untouched(tmp_path: Path) -> None:
    h = hooks(tmp_path)
    seen: list[str] = []
    h.around_runner_update_from_disk(lambda u, p, f: seen.append(p), updater(True), "/m", "auto")
    assert seen == ["/m"]


class FakeRunner:
    def __init__(self, draft: bool = False) -> None:
        self.is_draft_worker = draft
        self.device = "cuda"
        self.decode_cuda_graph_capture_bs: list[int] = []
        self.captures = 0

    def init_decode_cuda_graph(self) -> None:
        # as 0.5.23 does: the decode graph runner, and its sizes copied onto the model runner
        self.captures += 1
        self.decode_cuda_graph_runner = SimpleNamespace(capture_bs=[1, 2, 4])
        self.decode_cuda_graph_capture_bs = [1, 2, 4]


def test_async_decode_graph_serves_eagerly_then_captures_at_idle(tmp_path: Path) -> None:
    h = hooks(tmp_path, async_cuda_graphs=True)
    runner = FakeRunner()
    calls: list[bool] = []
    h.around_init_cuda_graphs(
        lambda r, capture_decode_cuda_graph: calls.append(capture_decode_cuda_graph), runner
    )
    assert calls == [False] and h.async_decode_pending

    state = {"idle": True}
    scheduler = SimpleNamespace(
        forward_ct=0,
        is_fully_idle=lambda: state["idle"],
        tp_worker=SimpleNamespace(model_runner=runner),
    )
    h.after_on_idle(None, scheduler)  # no completed request yet
    scheduler.forward_ct = 3
    state["idle"] = False
    h.after_on_idle(None, scheduler)  # busy
    assert runner.captures == 0
    state["idle"] = True
    h.after_on_idle(None, scheduler)
    h.after_on_idle(None, scheduler)
    assert runner.captures == 1 and not h.async_decode_pending
    assert h.status.record["async_decode_graph"]["capture_bs"] == [1, 2, 4]


def test_async_capture_is_target_only(tmp_path: Path) -> None:
    h = hooks(tmp_path, async_cuda_graphs=True)
    calls: list[Any] = []
    h.around_init_cuda_graphs(lambda r, *a, **k: calls.append((a, k)), FakeRunner(draft=True))
    assert calls == [((), {})] and not h.async_decode_pending


def test_export_root_is_per_operation_and_safe(tmp_path: Path) -> None:
    assert sched.export_root(tmp_path, "coldsnap-abc") == tmp_path / "native" / "coldsnap-abc"
    assert sched.export_root(tmp_path, "../../etc") == tmp_path / "native" / ".._.._etc"
    assert sched.export_root(tmp_path, None) == tmp_path / "native" / "export"
    assert sched.export_root(tmp_path, "..") == tmp_path / "native" / "export"


def test_release_of_weights_is_refused_when_nothing_was_registered(
    tmp_path: Path, sglang_cpu: None
) -> None:
    h = hooks(tmp_path)
    released: list[Any] = []
    mgr = SimpleNamespace(tp_cpu_group=None, offload_tags=set())
    out = h.around_release(
        lambda m, r: released.append(r), mgr, SimpleNamespace(tags=["weights"], rid="op1")
    )
    assert released == []  # SGLang's release never ran
    assert type(out).__name__ == "ReleaseMemoryOccupationReqOutput"
    record = h.status.record
    assert record["outcome"] == "failed" and "no model storages were registered" in record["error"]


def test_weight_runners_follow_the_variant_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """`selector` (0.5.23): SGLang's `_select_runners`; `tp-and-draft-worker` (0.5.17): the
    target worker's runner, then the draft worker's `draft_runners`."""
    target, draft1, draft2 = object(), object(), object()
    mgr = SimpleNamespace(
        _select_runners=lambda selector: [("target", target), ("draft", draft1)],
        tp_worker=SimpleNamespace(model_runner=target),
        draft_worker=SimpleNamespace(draft_worker=SimpleNamespace(draft_runners=[draft1, draft2])),
    )
    monkeypatch.setattr(sched, "variant_in_use", lambda key: "selector")
    assert sched.weight_runners(mgr) == [("target", target), ("draft", draft1)]
    monkeypatch.setattr(sched, "variant_in_use", lambda key: "tp-and-draft-worker")
    assert sched.weight_runners(mgr) == [
        ("target", target),
        ("draft", draft1),
        ("draft", draft2),
    ]
    mgr.draft_worker = None
    assert sched.weight_runners(mgr) == [("target", target)]


def test_finalize_hook_only_where_the_build_defers_the_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hooks = sched.SchedulerHooks(Settings(), StatusFile(None, "x", {}))
    assert sched.FINALIZE_CONTRACT in [t for t, _, _ in hooks.targets()]
    monkeypatch.setattr(sched, "variant_in_use", lambda key: "none")
    assert sched.FINALIZE_CONTRACT not in [t for t, _, _ in hooks.targets()]
