"""A refill after the first (a wake) verifies the payload as it reads it: an engine launched to
hydrate a preverified payload at startup (COLDSNAP_ARTIFACT_PREVERIFIED) does not carry that
into its later resumes, and a pack damaged while it slept is refused, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import coldsnap.plugin._scheduler as sched
from coldsnap._wire import ResumePlan
from coldsnap.plugin import Settings, StatusFile, StorageRegistry
from coldsnap.plugin._payload import PayloadRefused, pack_dir
from coldsnap.providers.native import export_pack


def test_a_wake_s_resume_verifies_the_pack_an_engine_launched_preverified_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sched, "_tp_rank", lambda group=None: 0)
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    registry = StorageRegistry()
    registry.register("target", model)
    settings = Settings(
        mode="restore",
        runtime_dir=tmp_path / "run",
        startup_source="payload",
        artifact_dir=tmp_path / "payload",
        artifact_preverified=True,  # the restore's stage verified the payload it started from
    )
    hooks = sched.SchedulerHooks(settings, StatusFile(tmp_path, "scheduler-tp0", {}), registry)
    pack = pack_dir(tmp_path / "payload", 0, "target")
    export_pack(model, pack, block_bytes=4096)
    (packfile,) = pack.glob("*.pack")
    data = bytearray(packfile.read_bytes())
    data[100] ^= 0xFF  # damaged while the engine slept
    packfile.write_bytes(bytes(data))
    plan = ResumePlan(source="payload", payload_dir=str(tmp_path / "payload"), preverified=False)
    before = model.weight.detach().clone()
    with pytest.raises(PayloadRefused, match=r"checksum|damaged|differs"):
        hooks._stage(plan, 0)
    assert torch.equal(model.weight, before)
