"""Decode graphs captured at the first scheduler-idle boundary (COLDSNAP_ASYNC_CUDA_GRAPHS), on
fakes shaped like SGLang 0.5.17's target ModelRunner: `init_cuda_graphs` leaves the eager runner
as `decode_cuda_graph_runner` when the decode capture is off, `init_decode_cuda_graph` puts a
DecodeCudaGraphRunner (its `capture_bs`) there, and, unlike 0.5.23, the runner keeps no
`decode_cuda_graph_capture_bs`. What was captured and how long it took must be readable after a
restore: the status record's `async_decode_graph` and one log line of a fixed shape."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import coldsnap.plugin._scheduler as sched
from coldsnap._wire import read_status, status_path
from coldsnap.plugin import Settings, StatusFile, StorageRegistry


class Runner0517:
    """The target runner of 0.5.17 as the hooks see it."""

    def __init__(self, capture_bs: list[int], fail: str | None = None) -> None:
        self.is_draft_worker = False
        self.device = "cuda"
        self.eager_runner = object()
        self.decode_cuda_graph_runner: Any = None
        self.capture_bs = capture_bs
        self.fail = fail

    def init_cuda_graphs(self, capture_decode_cuda_graph: bool = True) -> None:
        assert not capture_decode_cuda_graph  # the hook deferred it
        self.decode_cuda_graph_runner = self.eager_runner

    def init_decode_cuda_graph(self) -> None:
        if self.fail:
            raise RuntimeError(self.fail)
        self.decode_cuda_graph_runner = SimpleNamespace(capture_bs=list(self.capture_bs))


def deferred(tmp_path: Path, runner: Runner0517) -> tuple[sched.SchedulerHooks, Any]:
    settings = Settings(mode="restore", runtime_dir=tmp_path, async_cuda_graphs=True)
    status = StatusFile(tmp_path, "scheduler-tp0", {"role": "scheduler", "mode": "restore"})
    h = sched.SchedulerHooks(settings, status, StorageRegistry())
    h.around_init_cuda_graphs(Runner0517.init_cuda_graphs, runner, capture_decode_cuda_graph=True)
    assert h.status.record["async_decode_graph"] == "pending"
    scheduler = SimpleNamespace(
        forward_ct=1, is_fully_idle=lambda: True, tp_worker=SimpleNamespace(model_runner=runner)
    )
    return h, scheduler


def test_the_count_and_seconds_of_the_idle_capture_are_recorded_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = Runner0517([8, 1, 4, 2])
    h, scheduler = deferred(tmp_path, runner)
    with caplog.at_level(logging.INFO, logger="coldsnap.plugin"):
        h.after_on_idle(None, scheduler)

    # what the orchestrator (and the harness) reads back, strictly typed
    record = read_status(status_path(tmp_path, "scheduler-tp0")).async_decode_graph
    assert isinstance(record, dict)
    assert record["outcome"] == "ok" and record["error"] is None
    assert record["graphs"] == 4 and record["capture_bs"] == [1, 2, 4, 8]
    assert record["captured_after_forward"] == 1
    assert isinstance(record["seconds"], float) and record["seconds"] >= 0.0
    lines = [r.getMessage() for r in caplog.records if "idle decode graphs" in r.getMessage()]
    assert len(lines) == 1
    assert re.fullmatch(
        r"coldsnap: idle decode graphs captured: graphs=4 batch_sizes=1,2,4,8 "
        r"seconds=\d+\.\d{3} after_forward=1",
        lines[0],
    ), lines[0]


def test_a_failed_idle_capture_is_recorded_before_it_ends_the_scheduler(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h, scheduler = deferred(tmp_path, Runner0517([1, 2], fail="CUDA out of memory"))
    with caplog.at_level(logging.ERROR, logger="coldsnap.plugin"), pytest.raises(RuntimeError):
        h.after_on_idle(None, scheduler)
    record = read_status(status_path(tmp_path, "scheduler-tp0")).async_decode_graph
    assert isinstance(record, dict) and record["outcome"] == "failed"
    assert "CUDA out of memory" in record["error"] and record["graphs"] == 0
    assert h.status.record["events"][-1]["event"] == "decode_graph_failed"
    assert any("idle decode graphs failed" in r.getMessage() for r in caplog.records)
