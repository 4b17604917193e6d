"""The prefill helpers' protocol and the provider steps that run them (on CPU: a helper that
cannot reach a GPU says why, and the engine refills from the pack). The device-to-device path
itself runs in tests/gpu/test_prefill_gpu.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from coldsnap.machine import steps as s
from coldsnap.plugin import _payload
from coldsnap.providers import HydrationFailed, PackDirectory, export_pack
from coldsnap.providers._convert import dumps
from coldsnap.providers._steps import NativeProvider
from coldsnap.providers.native import _prefill

from .provider_helpers import storage_bytes


def _payload_dir(root: Path) -> Path:
    src = {"w": torch.arange(4096, dtype=torch.float32), "b": torch.ones(77)}
    for rank in (0, 1):
        export_pack(src, root / f"tp{rank}" / "target")
    (root / "tp1" / "stray").mkdir()  # no index: not a role
    (root / "notes").mkdir()
    return root


def test_rank_roles_reads_the_payload_layout(tmp_path: Path) -> None:
    payload = _payload_dir(tmp_path / "payload")
    assert _prefill.rank_roles(payload) == {
        0: {"target": payload / "tp0" / "target"},
        1: {"target": payload / "tp1" / "target"},
    }


def test_a_failed_helper_is_named_and_an_absent_one_times_out(tmp_path: Path) -> None:
    failed = _prefill.PrefillRecord(device=0, error="RuntimeError: no CUDA here")
    (tmp_path / _prefill.FAILED).write_bytes(dumps(failed))
    with pytest.raises(HydrationFailed, match="failed: RuntimeError: no CUDA here"):
        _prefill.wait_record(tmp_path, timeout=1.0)
    with pytest.raises(HydrationFailed, match=r"not ready after 0\.1 s"):
        _prefill.wait_record(tmp_path / "absent", timeout=0.1)


def test_a_record_of_another_format_is_refused(tmp_path: Path) -> None:
    data = dumps(_prefill.PrefillRecord(device=0)).replace(b'"format":1', b'"format":2')
    (tmp_path / _prefill.READY).write_bytes(data)
    with pytest.raises(HydrationFailed, match="format/kind: expected 1"):
        _prefill.wait_record(tmp_path, timeout=1.0)


def test_hydration_without_its_prefill_refills_from_the_pack_and_says_why(tmp_path: Path) -> None:
    src = {"w": torch.arange(4096, dtype=torch.float32)}
    export_pack(src, tmp_path / "pack")
    folder = tmp_path / "prefill" / "tp0" / "target"
    folder.mkdir(parents=True)
    failed = _prefill.PrefillRecord(device=0, error="RuntimeError: no CUDA here")
    (folder / _prefill.FAILED).write_bytes(dumps(failed))
    dst = {"w": torch.zeros(4096)}
    summary = _payload.hydrate(dst, PackDirectory(tmp_path / "pack"), folder)
    assert storage_bytes(dst) == storage_bytes(src)
    assert summary["prefill"].startswith("unused: the prefill of")
    assert "no CUDA here" in summary["prefill"]
    assert summary["cuda_path"] == ""  # CPU storages: the pack filled them


def test_prefill_folder_follows_the_plan() -> None:
    plan = SimpleNamespace(prefill_dir="/run/x/prefill")
    assert _payload.prefill_folder(plan, 1, "draft") == Path("/run/x/prefill/tp1/draft")
    assert _payload.prefill_folder(SimpleNamespace(prefill_dir=None), 0, "target") is None


def _ctx(tmp_path: Path, payload: Path) -> SimpleNamespace:
    facts = {s.WEIGHT_SOURCE.name: {"provider": "native", "payload_dir": str(payload)}}
    ctx = SimpleNamespace(workdir=tmp_path / "work", facts=facts)
    ctx.record = lambda **kw: facts.update(kw)
    ctx.workdir.mkdir()
    return ctx


def test_helpers_start_per_rank_and_end_with_a_report(tmp_path: Path, monkeypatch) -> None:
    """Real helper processes; without a GPU each one fails and says so (on a GPU host the
    same steps prefill: tests/gpu)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no helper here may reach a GPU
    payload = _payload_dir(tmp_path / "payload")
    provider, ctx = NativeProvider(), _ctx(tmp_path, payload)
    made = provider.prefill(ctx)[s.PREFILL.name]
    assert len(made["pids"]) == 2 and ctx.facts[s.PREFILL.name] == made  # journaled first
    ctx.facts[s.PREFILL.name] = made
    for rank in (0, 1):  # each helper publishes (or gives up) on its own
        with pytest.raises(HydrationFailed, match="failed"):
            _prefill.wait_record(Path(made["dir"]) / f"tp{rank}" / "target", timeout=60.0)
    report = provider.end_prefill(ctx)[s.PREFILL_REPORT.name]
    assert sorted(report) == ["tp0/target", "tp1/target"]
    assert all(state.startswith("failed: ") for state in report.values())
    assert all(not Path(f"/proc/{pid}").exists() for pid in made["pids"])  # ended and reaped


def test_the_compensation_ends_helpers_still_waiting(tmp_path: Path) -> None:
    payload = _payload_dir(tmp_path / "payload")
    provider, ctx = NativeProvider(), _ctx(tmp_path, payload)
    made = provider.prefill(ctx)[s.PREFILL.name]
    provider.stop_prefill(ctx)
    assert all(not Path(f"/proc/{pid}").exists() for pid in made["pids"])


def test_a_payload_without_ranks_is_refused(tmp_path: Path) -> None:
    (tmp_path / "payload").mkdir()
    with pytest.raises(Exception, match="no tp<rank>/<role> pack"):
        NativeProvider().prefill(_ctx(tmp_path, tmp_path / "payload"))
