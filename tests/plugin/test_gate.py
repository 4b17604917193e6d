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
    tmp_path: Path, op: str, outcome: str, event: str, error: str | None = None, rank: int = 0
) -> None:
    st = StatusFile(tmp_path, f"scheduler-tp{rank}", {})
    st.update(event, operation=op, outcome=outcome, error=error)


def engine(status: Any, tp: int = 1) -> Any:
    """A fake tokenizer manager of a `tp`-rank engine."""
    return SimpleNamespace(
        server_status=status, server_args=SimpleNamespace(tp_size=tp, pp_size=1, dp_size=1)
    )


def run(coro: Any) -> Any:
    return asyncio.new_event_loop().run_until_complete(coro)


def test_gate_holds_starting_until_a_successful_resume(tmp_path: Path) -> None:
    from sglang.srt.managers.tokenizer_manager import ServerStatus

    g = gate(tmp_path)
    tm = engine(ServerStatus.Up)
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
    tm = engine(ServerStatus.Up)

    async def release(tm: Any, obj: Any) -> None:
        rank_status(tmp_path, obj.rid, "failed", "release_failed", "export: disk full")

    with pytest.raises(ReleaseFailed, match="disk full"):
        run(g.around_release(release, tm, SimpleNamespace(tags=["weights"], rid=None)))
    assert tm.server_status == ServerStatus.Up and not g.released


def test_a_rank_that_never_answered_is_a_failure(tmp_path: Path) -> None:
    failed = gate(tmp_path).rank_failures("op-nobody", ["scheduler-tp0"])
    assert [f["outcome"] for f in failed] == ["missing"]


def test_the_gate_opens_only_when_every_rank_resumed(tmp_path: Path) -> None:
    """TP2: rank 0 alone reporting its resume keeps the gate closed and names rank 1."""
    from sglang.srt.managers.tokenizer_manager import ServerStatus

    g = gate(tmp_path)
    tm = engine(ServerStatus.Up, tp=2)

    async def release(tm: Any, obj: Any) -> None:
        for rank in (0, 1):
            rank_status(tmp_path, obj.rid, "ok", "released", rank=rank)

    run(g.around_release(release, tm, SimpleNamespace(tags=None, rid=None)))

    async def only_rank0(tm: Any, obj: Any) -> None:
        rank_status(tmp_path, obj.rid, "ok", "resumed", rank=0)

    with pytest.raises(ResumeFailed, match="scheduler-tp1: missing: no report of operation"):
        run(g.around_resume(only_rank0, tm, SimpleNamespace(tags=None, rid="op-1")))
    assert tm.server_status == ServerStatus.Starting and g.closed

    async def both(tm: Any, obj: Any) -> None:
        for rank in (0, 1):
            rank_status(tmp_path, obj.rid, "ok", "resumed", rank=rank)

    run(g.around_resume(both, tm, SimpleNamespace(tags=None, rid="op-2")))
    assert tm.server_status == ServerStatus.Up and not g.closed


def test_expected_ranks_follow_the_server_args() -> None:
    from coldsnap.plugin._gate import TopologyUnknown, expected_ranks

    assert expected_ranks(engine(None, tp=2)) == ["scheduler-tp0", "scheduler-tp1"]
    tm = SimpleNamespace(server_args=SimpleNamespace(tp_size=2, pp_size=2, dp_size=1))
    assert expected_ranks(tm) == [
        "scheduler-tp0", "scheduler-tp1", "scheduler-tp0-pp1", "scheduler-tp1-pp1",
    ]  # fmt: skip
    with pytest.raises(TopologyUnknown, match="tp"):
        expected_ranks(SimpleNamespace(server_args=SimpleNamespace(tp_size=0, pp_size=1)))


def test_plain_attribute_variant_guards_server_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where server_status is a plain instance attribute (variant seen in 0.5.17), the gate
    puts a property on TokenizerManager: SGLang's own `Up` (a health probe, warm-up) is refused
    while the gate is closed, and the gate's own open goes through."""
    from sglang.srt.managers.tokenizer_manager import ServerStatus, TokenizerManager

    import coldsnap.plugin._gate as gate_module
    from coldsnap.plugin._gate import STATE_FIELD_CONTRACT, STATUS_GUARD_TARGET

    monkeypatch.setattr(gate_module, "variant_in_use", lambda key: "plain-attribute")
    # Restored after the test (0.5.23's own property).
    monkeypatch.setattr(
        TokenizerManager, "server_status", TokenizerManager.__dict__["server_status"]
    )
    g = gate(tmp_path)
    assert STATE_FIELD_CONTRACT not in [t for t, _, _ in g.targets()]
    assert g.install_guards() == [STATUS_GUARD_TARGET]
    assert g.guards_landed()
    tm = TokenizerManager.__new__(TokenizerManager)
    tm.server_status = ServerStatus.Up
    assert tm.server_status == ServerStatus.Up and tm.__dict__["server_status"] == ServerStatus.Up
    g.close(tm, reason="release")
    assert tm.server_status == ServerStatus.Starting
    tm.server_status = ServerStatus.Up  # SGLang's health endpoint after a late answer
    assert tm.server_status == ServerStatus.Starting
    tm.server_status = ServerStatus.UnHealthy  # anything but Up still goes through
    assert tm.server_status == ServerStatus.UnHealthy
    g.open(tm)
    assert tm.server_status == ServerStatus.Up


def test_guards_are_not_installed_for_the_state_field_variant(tmp_path: Path) -> None:
    from coldsnap.plugin._gate import STATE_FIELD_CONTRACT

    g = gate(tmp_path)
    assert STATE_FIELD_CONTRACT in [t for t, _, _ in g.targets()]
    assert g.install_guards() == [] and g.guards_landed()
