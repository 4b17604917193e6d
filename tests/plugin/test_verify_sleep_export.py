"""A release exports the weights only in a capture. An n610 image keeps its capture's settings
(export on release), so once its restored engine has been refilled from the capsule's payload,
a sleep's release writes no further copy: the capsule's payload is what the wake reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import coldsnap.plugin._scheduler as sched
from coldsnap._wire import ResumePlan
from coldsnap.plugin import Settings, StatusFile, StorageRegistry


def test_a_release_after_a_refill_from_a_payload_exports_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sched, "_tp_rank", lambda group=None: 0)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    registry = StorageRegistry()
    registry.register("target", model)
    art = tmp_path / "art"
    settings = Settings(
        mode="capture", runtime_dir=tmp_path / "run", export_model_payload=True, artifact_dir=art
    )
    hooks = sched.SchedulerHooks(settings, StatusFile(tmp_path, "scheduler-tp0", {}), registry)

    captured = hooks._before_release(["weights"], None, "capture")  # the capture's one export
    assert captured is not None and (Path(captured["root"]) / "tp0" / "target").is_dir()

    # the restored image is refilled from the capsule's payload (here: that export)
    plan = ResumePlan(source="payload", payload_dir=captured["root"], preverified=False)
    staged = hooks._stage(plan, 0)
    hooks._resume_with(plan, staged, lambda *a, **k: None, None, None, ["weights"], (), {})

    for sleep in ("sleep-1", "sleep-2"):
        assert hooks._before_release(["weights"], None, sleep) is None
    exported = sorted(p.name for p in (art / "native").iterdir())
    assert exported == ["capture"], f"a sleep wrote another copy of the weights: {exported}"


def test_a_capture_whose_release_was_undone_from_the_checkpoint_exports_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture's release compensated (weights reloaded from the checkpoint) and tried again
    must export again: the first export was discarded with the compensation."""
    monkeypatch.setattr(sched, "_tp_rank", lambda group=None: 0)
    registry = StorageRegistry()
    registry.register("target", torch.nn.Linear(4, 4))
    settings = Settings(
        mode="capture", runtime_dir=tmp_path / "run", export_model_payload=True,
        artifact_dir=tmp_path / "art",
    )  # fmt: skip
    hooks = sched.SchedulerHooks(settings, StatusFile(tmp_path, "scheduler-tp0", {}), registry)
    assert hooks._before_release(["weights"], None, "first") is not None
    assert hooks._before_release(["weights"], None, "again") is not None
