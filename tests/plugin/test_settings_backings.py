"""Settings that change what the scheduler hooks do on fakes:
COLDSNAP_LIVE_BACKING (what released weights keep, and where), COLDSNAP_PROCESS_ARTIFACT_ROOT
(where the disk backing writes), COLDSNAP_SGLANG_RECOVERY_LOAD_FORMAT (what a recovery's
checkpoint must hold), COLDSNAP_ARTIFACT_PREVERIFIED (passed to every hydration) and
COLDSNAP_KEEP_RESIDUAL."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import coldsnap.plugin._scheduler as sched
from coldsnap._wire import ResumePlan
from coldsnap.plugin import Settings, StatusFile, StorageRegistry
from coldsnap.plugin._memory import ColdsnapMemorySaverAdapter, HostDiscardBackend
from coldsnap.plugin._payload import PayloadRefused

MB = 1 << 20


class Model(torch.nn.Module):
    """Big enough that a release returns whole pages; a non-persistent buffer like a rotary
    cache."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(MB // 4), requires_grad=False)
        self.register_buffer("cache", torch.rand(MB // 4), persistent=False)


class Saver:
    enabled = False

    def pause(self, tag: str) -> None:
        pass

    def resume(self, tag: str) -> None:
        pass


def _checkpoint(path: Path, model: Model) -> Path:
    path.mkdir(parents=True)
    save_file({"w": model.w.detach().clone()}, str(path / "model.safetensors"))
    return path


def _hooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: Model, **settings: Any
) -> tuple[sched.SchedulerHooks, Any]:
    """Hooks with `model` registered as the target, and a weight manager whose one runner
    loaded it from a checkpoint next to it."""
    registry = StorageRegistry()
    registry.register("target", model)
    runner = SimpleNamespace(
        is_draft_worker=False,
        model_config=SimpleNamespace(model_path=str(_checkpoint(tmp_path / "ckpt", model))),
    )
    mgr = SimpleNamespace(_select_runners=lambda selector: [("target", runner)])
    monkeypatch.setattr(sched, "variant_in_use", lambda key: "selector")
    monkeypatch.setattr(sched, "_tp_rank", lambda group=None: 0)
    s = Settings(mode="capture", runtime_dir=tmp_path, **settings)
    status = StatusFile(tmp_path, "scheduler-tp0", {})
    return sched.SchedulerHooks(s, status, registry), mgr


@pytest.mark.parametrize(("backing", "kept"), [("discard", False), ("disk", False), ("cpu", True)])
def test_on_cpu_only_the_cpu_backing_keeps_the_weights_in_memory(
    backing: str, kept: bool, tmp_path: Path
) -> None:
    model = Model()
    before = model.w.detach().clone()
    registry = StorageRegistry()
    registry.register("target", model)
    adapter = ColdsnapMemorySaverAdapter(
        Saver(), live_backing=backing, host=HostDiscardBackend(registry)
    )
    adapter.pause("weights")
    assert torch.equal(model.w, before) is kept
    assert adapter.freed_by() == ("none" if kept else "host_discard")


def test_the_cpu_backing_asks_the_saver_for_a_cpu_backup_of_the_weights() -> None:
    seen: list[tuple[str, bool]] = []

    class Inner(Saver):
        def region(self, tag: str, enable_cpu_backup: bool = False) -> Any:
            import contextlib

            seen.append((tag, enable_cpu_backup))
            return contextlib.nullcontext()

    for backing in ("cpu", "discard"):
        adapter = ColdsnapMemorySaverAdapter(Inner(), live_backing=backing)
        with adapter.region("weights"):
            pass
        with adapter.region("kv_cache"):
            pass
    assert seen == [("weights", True), ("kv_cache", False), ("weights", False), ("kv_cache", False)]


def test_the_disk_backing_writes_under_the_process_artifact_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coldsnap.providers.native import PackDirectory, hydrate_pack

    model = Model()
    before = model.w.detach().clone()
    for root in (tmp_path / "one", tmp_path / "two"):
        h, mgr = _hooks(
            tmp_path / root.name, monkeypatch, model, live_backing="disk",
            process_artifact_root=root,
        )  # fmt: skip
        fields = h._keep_state(["kv_cache", "weights"], None, "op/1", mgr)
        pack = root / "live" / "op_1" / "tp0" / "target"
        assert fields["spilled"]["root"] == str(root / "live" / "op_1")
        assert (pack / "index.json").is_file()
    with torch.no_grad():
        model.w.zero_()
    hydrate_pack(model, PackDirectory(pack))  # a native resume may name the spill
    assert torch.equal(model.w, before)


def test_other_backings_write_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "proc"
    h, mgr = _hooks(tmp_path, monkeypatch, Model(), process_artifact_root=root)
    assert "spilled" not in h._keep_state(["weights"], None, "op", mgr)
    assert not root.exists()


def test_the_residual_is_kept_at_release_unless_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Model()
    h, mgr = _hooks(tmp_path, monkeypatch, model)
    fields = h._keep_state(["weights"], None, "op", mgr)
    assert fields["residual"]["target"]["names"] == ["cache"]  # the checkpoint holds w
    before = model.cache.detach().clone()
    with torch.no_grad():
        model.cache.zero_()
    assert h._restore_residuals()["target"]["tensors"] == 1
    assert torch.equal(model.cache, before)
    h, mgr = _hooks(tmp_path / "off", monkeypatch, model, keep_residual=False)
    assert h._keep_state(["weights"], None, "op", mgr) == {"residual": "off"}
    assert h._restore_residuals() == "off"
    assert h._keep_state(["kv_cache"], None, "op", mgr) == {}  # weights stay: nothing to keep


@pytest.mark.parametrize(
    ("setting", "plan_format", "refused"),
    [
        ("auto", None, False),
        ("safetensors", None, False),
        ("pt", None, True),
        ("pt", "safetensors", False),  # the plan's format wins
        ("auto", "pt", True),
    ],
)
def test_the_recovery_load_format_must_match_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, plan_format: str | None,
    refused: bool,
) -> None:  # fmt: skip
    h, _ = _hooks(tmp_path, monkeypatch, Model(), recovery_load_format=setting)
    plan = ResumePlan(
        source="checkpoint", checkpoint=str(tmp_path / "ckpt"), load_format=plan_format
    )
    if refused:
        with pytest.raises(PayloadRefused, match="holds no"):
            h._stage(plan, 0)
    else:
        h._stage(plan, 0)


def test_a_recovery_is_refused_when_the_residual_could_not_be_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, mgr = _hooks(tmp_path, monkeypatch, Model())
    for f in (tmp_path / "ckpt").iterdir():
        f.rename(f.with_suffix(".bin"))  # names SGLang could load, but not read here
    h._keep_state(["weights"], None, "op", mgr)
    plan = ResumePlan(source="checkpoint", checkpoint=str(tmp_path / "ckpt"))
    with pytest.raises(PayloadRefused, match="residual state was not kept"):
        h._stage(plan, 0)


@pytest.mark.parametrize(("setting", "plan_says", "verify"), [
    (False, False, True), (True, False, True), (False, True, False),
])  # fmt: skip
def test_a_resume_verifies_unless_its_plan_says_preverified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: bool, plan_says: bool,
    verify: bool,
) -> None:  # fmt: skip
    from coldsnap.plugin import _payload

    h, _ = _hooks(tmp_path, monkeypatch, Model(), artifact_preverified=setting)
    seen: list[bool] = []
    monkeypatch.setattr(_payload, "prepare", lambda m, src, *, verify: (seen.append(verify), 0.0))
    monkeypatch.setenv("COLDSNAP_ARTIFACT_PREVERIFIED", str(int(not setting)))  # not read here
    plan = ResumePlan(source="payload", payload_dir=str(tmp_path), preverified=plan_says)
    h._stage(plan, 0)
    assert seen == [verify]
