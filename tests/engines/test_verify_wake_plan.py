"""The resume plan a wake writes asks the engine to verify the payload as it reads it, whatever
its stage says; a restore's plan hands on its stage's `preverified` (its refill follows
admission's check against the manifest on the cold start's critical path)."""

from __future__ import annotations

import json
from pathlib import Path

from coldsnap._wire import PLAN_FILE
from coldsnap.machine import WakeRequest
from coldsnap.machine import steps as s

from .test_sglang_steps import MockSGLang, adapter, ctx


def _plan_after_resume(tmp_path: Path, request: object) -> dict[str, object]:
    source = {"source": "payload", "payload_dir": str(tmp_path / "payload"), "preverified": True}
    step = ctx(tmp_path, **{s.WEIGHT_SOURCE.name: source})
    step.request = request
    adapter(MockSGLang()).resume_weights(step)
    return json.loads((tmp_path / PLAN_FILE).read_text())


def test_a_wake_s_plan_is_never_preverified(tmp_path: Path) -> None:
    target = tmp_path / "restore"
    target.mkdir()
    wake = WakeRequest(
        target=str(target), workdir=str(target / "ops" / "wake-1"), driver="n610",
        provider="native",
    )  # fmt: skip
    plan = _plan_after_resume(tmp_path, wake)
    assert plan["source"] == "payload" and plan["preverified"] is False


def test_a_restore_s_plan_keeps_what_its_stage_verified(tmp_path: Path) -> None:
    restore = ctx(tmp_path).request  # a restore request as the adapter's tests stand it in
    assert _plan_after_resume(tmp_path, restore)["preverified"] is True
