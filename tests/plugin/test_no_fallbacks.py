"""Issue 16 item 11 and the rest of item 8: nothing the plugin cannot read becomes a default.

A TP rank or group that cannot be read is refused naming what could not be read (never rank
0's pack); a malformed resume plan is refused naming the field (never "no plan"); an NCCL
boundary that cannot be described fails closed; COLDSNAP_RUNTIME_DIR naming a regular file is
refused at settings validation; COLDSNAP_ARTIFACT_PREVERIFIED has one parser.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import coldsnap.plugin._nccl as nccl
import coldsnap.plugin._scheduler as sched
from coldsnap._wire import PLAN_FILE, PlanError
from coldsnap.plugin import Settings, SettingsError, StatusFile, StorageRegistry, load_settings


def _unreadable_parallel_state(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    mod = types.ModuleType("sglang.srt.distributed.parallel_state")

    def get_tp_group() -> Any:
        raise exc

    mod.get_tp_group = get_tp_group  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang.srt.distributed.parallel_state", mod)


@pytest.mark.parametrize(
    "exc",
    [
        AssertionError("tensor model parallel group is not initialized"),
        RuntimeError("parallel name 'tp_group' has not been written in this process"),
        AttributeError("x"),
    ],
)
def test_an_unreadable_tp_rank_is_refused_not_rank_0(
    monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    _unreadable_parallel_state(monkeypatch, exc)
    with pytest.raises(sched.TopologyUnreadable, match="TP group"):
        sched._tp_rank()
    with pytest.raises(sched.TopologyUnreadable, match="TP group"):
        sched._tp_group()


def test_a_tp_group_without_a_rank_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("sglang.srt.distributed.parallel_state")
    mod.get_tp_group = lambda: SimpleNamespace(rank_in_group=None)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang.srt.distributed.parallel_state", mod)
    with pytest.raises(sched.TopologyUnreadable, match="rank_in_group"):
        sched._tp_rank()
    mod.get_tp_group = lambda: SimpleNamespace(rank_in_group=3)  # type: ignore[attr-defined]
    assert sched._tp_rank() == 3


def _hooks(tmp_path: Path) -> sched.SchedulerHooks:
    s = Settings(mode="restore", runtime_dir=tmp_path)
    return sched.SchedulerHooks(s, StatusFile(tmp_path, "scheduler-tp0", {}), StorageRegistry())


@pytest.mark.parametrize(
    ("plan", "field"),
    [
        ({"source": "checkpoint", "checkpoint": 7}, "checkpoint"),
        ({"source": "checkpoint", "checkpoint": "/c", "draft_checkpont": "/d"}, "draft_checkpont"),
        ([1, 2], "expected an object"),
        ("{not json", "not JSON"),
    ],
)
def test_a_malformed_plan_is_refused_not_treated_as_no_plan(
    tmp_path: Path, plan: Any, field: str
) -> None:
    text = plan if isinstance(plan, str) else json.dumps(plan)
    (tmp_path / PLAN_FILE).write_text(text)
    runner = SimpleNamespace(is_draft_worker=True)
    updater = SimpleNamespace(get_model_runner=lambda: runner)
    seen: list[str] = []
    with pytest.raises(PlanError, match=field):
        _hooks(tmp_path).around_runner_update_from_disk(
            lambda u, p, f: seen.append(p), updater, "/m", "auto"
        )
    assert seen == []  # the draft never reloaded from the target's path


class _Dist:
    def __init__(self, initialized: bool, backend: Any) -> None:
        self._init, self._backend = initialized, backend

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self._init

    def get_backend(self, group: Any) -> str:
        if isinstance(self._backend, BaseException):
            raise self._backend
        return str(self._backend)


def _with_dist(monkeypatch: pytest.MonkeyPatch, dist: _Dist) -> None:
    import torch.distributed

    for name in ("is_available", "is_initialized", "get_backend"):
        monkeypatch.setattr(torch.distributed, name, getattr(dist, name))


def test_an_nccl_group_whose_backend_cannot_be_read_fails_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _with_dist(monkeypatch, _Dist(True, RuntimeError("group destroyed")))
    group = SimpleNamespace(world_size=2, device_group=object())
    for step in (nccl.prepare, nccl.restore):
        with pytest.raises(nccl.NcclBoundaryError, match="backend of the TP device group"):
            step(group)


def test_nccl_boundary_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_dist(monkeypatch, _Dist(True, "gloo"))
    out = nccl.prepare(SimpleNamespace(world_size=1, device_group=object()))
    assert out["nccl"] == "noop" and "gloo" in out["reason"]
    _with_dist(monkeypatch, _Dist(False, "nccl"))
    out = nccl.restore(SimpleNamespace(world_size=2, device_group=object()))
    assert out["nccl"] == "noop" and "not initialised" in out["reason"]
    with pytest.raises(nccl.NcclBoundaryError, match="TP group is absent"):
        nccl.prepare(None)
    _with_dist(monkeypatch, _Dist(True, "nccl"))
    group = SimpleNamespace(world_size=2, device_group=object())
    assert nccl.restore(group)["reason"] == "nothing was torn down"  # live communicators kept
    comms = _FakeComms()
    out = nccl.prepare(group, comms)
    assert out["nccl"] == "torn_down" and out["done"] == ["pynccl_comm", "device_group"]
    out = nccl.restore(group, comms)
    assert out["nccl"] == "rebuilt" and out["done"] == ["pynccl_comm", "device_group"]
    assert comms.calls == ["teardown", "rebuild"] and not group.coldsnap_nccl_torn_down


class _FakeComms:
    """Stands in for SGLang's communicators (a CPU host has no NCCL to tear down)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def teardown(self, group: Any) -> list[str]:
        self.calls.append("teardown")
        group.coldsnap_nccl_torn_down = ["pynccl_comm", "device_group"]
        return group.coldsnap_nccl_torn_down

    def rebuild(self, group: Any) -> list[str]:
        self.calls.append("rebuild")
        done, group.coldsnap_nccl_torn_down = group.coldsnap_nccl_torn_down, False
        return done


def test_an_nccl_teardown_that_fails_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_dist(monkeypatch, _Dist(True, "nccl"))

    class Broken(_FakeComms):
        def teardown(self, group: Any) -> list[str]:
            raise RuntimeError("ncclCommDestroy: unhandled cuda error")

    with pytest.raises(nccl.NcclBoundaryError, match="teardown failed: RuntimeError: ncclComm"):
        nccl.prepare(SimpleNamespace(world_size=2, device_group=object()), Broken())


# ------------------------------------------------------------------------------ item 8
def test_runtime_dir_naming_a_regular_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "not-a-dir"
    f.write_text("")
    for name in ("COLDSNAP_RUNTIME_DIR", "COLDSNAP_ARTIFACT_DIR", "COLDSNAP_PROCESS_ARTIFACT_ROOT"):
        env = {"COLDSNAP_MODE": "capture", "COLDSNAP_RUNTIME_DIR": str(tmp_path), name: str(f)}
        with pytest.raises(SettingsError) as err:
            load_settings(env)
        assert name in err.value.variables and "not a directory" in str(err.value)
    load_settings({"COLDSNAP_MODE": "capture", "COLDSNAP_RUNTIME_DIR": str(tmp_path / "new")})


def test_artifact_preverified_has_one_parser_and_one_reader() -> None:
    """The plugin's settings read COLDSNAP_ARTIFACT_PREVERIFIED (with coldsnap._wire's one
    flag parser); the native provider reads no variable: its callers pass `verify`."""
    import inspect

    import coldsnap._wire as wire
    import coldsnap._wire._env as settings
    import coldsnap.providers.native._hydrate as hydrate

    assert settings.parse_flag is wire.parse_flag
    assert "os.environ" not in inspect.getsource(hydrate)
    for raw in ("1", " TRUE ", "yes", "On", "0", "false", "NO", "off", "", "  "):
        want = raw.strip().lower() in wire.FLAG_TRUE
        assert load_settings({"COLDSNAP_ARTIFACT_PREVERIFIED": raw}).artifact_preverified is want
    for raw in ("2", "y", "tru e"):
        with pytest.raises(SettingsError, match="COLDSNAP_ARTIFACT_PREVERIFIED"):
            load_settings({"COLDSNAP_ARTIFACT_PREVERIFIED": raw})
