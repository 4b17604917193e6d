"""The providers' machine-side steps on a fake step context: each makes exactly the facts its
shared step declares, and refuses (naming what is wrong) instead of passing on bad weights."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from coldsnap.artifacts import checkpoint_digests
from coldsnap.machine import PayloadProvider, Registry, WeightSource
from coldsnap.machine import steps as s
from coldsnap.providers import CheckpointError, PackDamaged, ProviderError, export_pack
from coldsnap.providers._steps import NativeProvider, RecoveryProvider, register


class Ctx:
    def __init__(self, facts: dict[str, Any], step: Any, model: Path | None = None) -> None:
        self.facts = facts
        self.step = step
        self.request = SimpleNamespace(model=SimpleNamespace(path=str(model)) if model else None)
        self.checks = 0

    def check(self) -> None:
        self.checks += 1


def _names(step: Any) -> set[str]:
    return {f.name for f in step.makes}


def _export(root: Path, seed: int) -> None:
    torch.manual_seed(seed)
    for role in ("weights", "buffers"):
        export_pack({"w": torch.randn(64, 64), "b": torch.randn(8)}, root / "tp0" / role)


@pytest.fixture
def exported(tmp_path: Path) -> Path:
    """An export directory where the engine wrote twice; the newer root is this capture's."""
    export = tmp_path / "export"
    _export(export / "old", 0)
    old = time.time() - 60
    os.utime(export / "old", (old, old))
    _export(export / "new", 1)
    return export


def test_native_export_finds_the_newest_payload(exported: Path) -> None:
    ctx = Ctx({s.EXPORT_DIR.name: str(exported)}, s.EXPORT)
    made = NativeProvider().export(ctx)
    assert set(made) == _names(s.EXPORT)
    assert made[s.PAYLOAD_DIR.name] == str(exported / "new")
    assert made[s.PACKS.name] == 2
    files = [f for f in (exported / "new").rglob("*") if f.is_file()]
    assert made[s.PAYLOAD_BYTES.name] == sum(f.stat().st_size for f in files) > 64 * 64 * 4


def test_native_export_refuses_an_empty_export(tmp_path: Path) -> None:
    with pytest.raises(ProviderError, match="exported no pack"):
        NativeProvider().export(Ctx({s.EXPORT_DIR.name: str(tmp_path / "none")}, s.EXPORT))


def test_native_discard_export_removes_the_payload(exported: Path) -> None:
    ctx = Ctx({s.PAYLOAD_DIR.name: str(exported / "new")}, s.EXPORT)
    NativeProvider().discard_export(ctx)
    assert not (exported / "new").exists() and (exported / "old").exists()
    NativeProvider().discard_export(ctx)  # idempotent
    NativeProvider().discard_export(Ctx({}, s.EXPORT))  # export failed before finding one


def test_native_stage_verifies_and_names_the_weight_source(exported: Path) -> None:
    payload = exported / "new"
    ctx = Ctx({s.PAYLOAD_DIR.name: str(payload)}, s.STAGE_PAYLOAD)
    made = NativeProvider().stage(ctx)
    assert set(made) == _names(s.STAGE_PAYLOAD)
    assert WeightSource.from_fact(made[s.WEIGHT_SOURCE.name]) == WeightSource(
        source="payload", payload_dir=str(payload), preverified=True
    )
    assert made[s.VERIFY_SECONDS.name] >= 0 and ctx.checks == 2


def test_native_stage_refuses_a_damaged_pack(exported: Path) -> None:
    payload = exported / "new"
    pack = next(payload.rglob("*.pack"))
    data = bytearray(pack.read_bytes())
    data[4096 + 100] ^= 0xFF  # inside the second extent (the first is 32 bytes, padded)
    pack.write_bytes(bytes(data))
    with pytest.raises(PackDamaged):
        NativeProvider().stage(Ctx({s.PAYLOAD_DIR.name: str(payload)}, s.STAGE_PAYLOAD))


def test_native_stage_refuses_a_payload_without_packs(tmp_path: Path) -> None:
    with pytest.raises(PackDamaged, match="holds no pack"):
        NativeProvider().stage(Ctx({s.PAYLOAD_DIR.name: str(tmp_path)}, s.STAGE_PAYLOAD))


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"weights")
    return path


def _pinned(path: Path) -> dict[str, str]:
    return {f.name: f.sha256 for f in checkpoint_digests(path)}


def test_recovery_stage_checks_the_pinned_files(checkpoint: Path) -> None:
    ctx = Ctx({s.CAPSULE_CHECKPOINT.name: _pinned(checkpoint)}, s.VERIFY_CHECKPOINT, checkpoint)
    made = RecoveryProvider().stage(ctx)
    assert set(made) == _names(s.VERIFY_CHECKPOINT)
    source = WeightSource.from_fact(made[s.WEIGHT_SOURCE.name])
    assert source == WeightSource(source="checkpoint", checkpoint=str(checkpoint))
    assert made[s.CHECKPOINT_FILES.name] == 2


def test_recovery_stage_names_each_file_that_differs(checkpoint: Path) -> None:
    pinned = _pinned(checkpoint)
    (checkpoint / "model.safetensors").write_bytes(b"other weights")
    (checkpoint / "config.json").unlink()
    ctx = Ctx({s.CAPSULE_CHECKPOINT.name: pinned}, s.VERIFY_CHECKPOINT, checkpoint)
    with pytest.raises(CheckpointError) as info:
        RecoveryProvider().stage(ctx)
    assert info.value.lines == (
        "config.json: missing",
        "model.safetensors: differs from its pinned digest",
    )


def test_recovery_stage_refuses_a_capsule_that_pins_nothing(checkpoint: Path) -> None:
    ctx = Ctx({s.CAPSULE_CHECKPOINT.name: {}}, s.VERIFY_CHECKPOINT, checkpoint)
    with pytest.raises(CheckpointError, match="pins no checkpoint file"):
        RecoveryProvider().stage(ctx)


def test_recovery_exports_nothing() -> None:
    # export is the payload capability's (PayloadProvider): a checkpoint provider has none
    assert not hasattr(RecoveryProvider(), "export")
    assert not isinstance(RecoveryProvider(), PayloadProvider)
    assert isinstance(NativeProvider(), PayloadProvider)


def test_capabilities_select_the_weight_steps() -> None:
    request = SimpleNamespace()
    for provider, step in (
        (NativeProvider(), s.STAGE_PAYLOAD),
        (RecoveryProvider(), s.VERIFY_CHECKPOINT),
    ):
        chosen = [x for x in (s.EXPORT, s.STAGE_PAYLOAD, s.VERIFY_CHECKPOINT)
                  if x.when.holds(request, {"provider": provider})]  # fmt: skip
        assert step in chosen
        assert (s.EXPORT in chosen) == (provider.name == "native")


def test_register_names_both_providers() -> None:
    registry = Registry(entry_points=False)
    register(registry)
    assert registry.names("provider") == ("native", "recovery")
    assert isinstance(registry.get("provider", "native").build(None), NativeProvider)
    assert isinstance(registry.get("provider", "recovery").build(None), RecoveryProvider)
