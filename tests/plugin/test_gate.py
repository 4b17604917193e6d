"""The health gate on a fake tokenizer manager: closed from release until every rank reports
a successful resume; SGLang cannot reopen it behind our back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coldsnap.plugin import StatusFile
from coldsnap.plugin._gate import HealthGate, ReleaseFailed, ResumeFailed

pytestmark = pytest.mark.usefixtures("sglang_cpu")


def gate(tmp_path: Path) -> HealthGate:
    return HealthGate(StatusFile(tmp_path, "main", {}), tmp_path)


def rank_status(
    tmp_path: Path, op: str, outcome: str, event: str, error: str | None = None
) -> None:
    st = StatusFile(tmp_path, "scheduler-tp0", {})
    st.update(event, operation=op, outcome=outcome, error=error)


def run(coro: Any) -> Any:
    return asyncio.new_event_loop().run_until_complete(coro)


def test_gate_holds_starting_until_a_successful_resume(tmp_path: Path) -> None:
    from sglang.srt.managers.tokenizer_manager import ServerStatus

    g = gate(tmp_path)
    tm = SimpleNamespace(server_status=ServerStatus.Up)
    req = SimpleNamespace(tags=None, rid=None)

    async def release(tm: Any, obj: Any) -> None:
        rank_status(tmp_path, obj.rid, "ok", "released")

    run(g.around_release(release, tm, req))
    assert tm.server_status == ServerStatus.Starting and g.released == {
        "kv_cache",
        "weights",
        "cuda_graph",
    }

    calls: list[Any] = []
    g.around_set_state(lambda t, n, v: calls.append(v), tm, "_server_status", ServerStatus.Up)
    g.around_set_state(lambda t, n, v: calls.append(v), tm, "_gracefully_exit", True)
    assert calls == [True]  # a health probe cannot flip the status back to Up

    async def refused(tm: Any, obj: Any) -> None:
        rank_status(tmp_path, obj.rid, "refused", "resume_refused", "no resume plan")

    with pytest.raises(ResumeFailed, match="scheduler-tp0: refused: no resume plan"):
        run(g.around_resume(refused, tm, SimpleNamespace(tags=None, rid=None)))
    assert tm.server_status == ServerStatus.Starting

    async def resumed(tm: Any, obj: Any) -> None:
        rank_status(tmp_path, obj.rid, "ok", "resumed")

    run(g.around_resume(resumed, tm, SimpleNamespace(tags=["weights"], rid="op-w")))
    assert tm.server_status == ServerStatus.Starting  # kv_cache and cuda_graph still released
    run(g.around_resume(resumed, tm, SimpleNamespace(tags=["kv_cache", "cuda_graph"], rid=None)))
    assert tm.server_status == ServerStatus.Up and not g.closed


def test_a_refused_release_reopens_the_gate(tmp_path: Path) -> None:
    from sglang.srt.managers.tokenizer_manager import ServerStatus

    g = gate(tmp_path)
    tm = SimpleNamespace(server_status=ServerStatus.Up)

    async def release(tm: Any, obj: Any) -> None:
        rank_status(tmp_path, obj.rid, "failed", "release_failed", "export: disk full")

    with pytest.raises(ReleaseFailed, match="disk full"):
        run(g.around_release(release, tm, SimpleNamespace(tags=["weights"], rid=None)))
    assert tm.server_status == ServerStatus.Up and not g.released


def test_a_rank_that_never_answered_is_a_failure(tmp_path: Path) -> None:
    failed = gate(tmp_path).rank_failures("op-nobody")
    assert [f["outcome"] for f in failed] == ["missing"]
