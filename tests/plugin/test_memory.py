"""The storage registry and the host backend, in this process: release frees the pages of the
registered storages at the same addresses, and native hydration refills them bit-exactly."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import torch

from coldsnap.plugin import (
    ColdsnapMemorySaverAdapter,
    HostDiscardBackend,
    MemoryBackendError,
    RegistryError,
    StorageRegistry,
    discard_pages,
)

MB = 1 << 20


class Model(torch.nn.Module):
    def __init__(self, n: int = 4, size: int = 16 * MB) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        side = int((size // 2) ** 0.5)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(side, side, bias=False) for _ in range(n))
        for layer in self.layers:
            layer.weight.data = torch.randn(side, side, generator=g).to(torch.bfloat16)
        self.head = torch.nn.Linear(side, 8)
        self.register_buffer("inv_freq", torch.arange(64, dtype=torch.float32), persistent=False)
        self.register_buffer("scale", torch.ones(3))


class NoopSaver:
    """What SGLang's adapter is on CPU (memory saver disabled)."""

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self.calls: list[tuple[str, str]] = []

    @contextmanager
    def region(self, tag: str, enable_cpu_backup: bool = False):  # type: ignore[no-untyped-def]
        self.calls.append(("region", tag))
        yield

    def pause(self, tag: str) -> None:
        self.calls.append(("pause", tag))

    def resume(self, tag: str) -> None:
        self.calls.append(("resume", tag))

    def check_validity(self, caller: str) -> None:
        self.calls.append(("check", caller))


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


def clone_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_register_records_final_storages_once() -> None:
    model = Model(n=2, size=2 * MB)
    reg = StorageRegistry()
    entry = reg.register("target", model)
    kinds = {r.name: r.kind for r in entry.records}
    assert kinds["inv_freq"] == "nonpersistent_buffer" and kinds["scale"] == "buffer"
    assert entry.parameter_nbytes == sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert set(entry.tensors()) == {n for n, _ in model.named_parameters()} | {"scale"}
    entry.check_live()


def test_check_live_fails_closed_when_a_tensor_is_replaced() -> None:
    model = Model(n=2, size=2 * MB)
    entry = StorageRegistry().register("target", model)
    model.layers[0].weight.data = model.layers[0].weight.data.clone()
    with pytest.raises(RegistryError, match=r"layers\.0\.weight' changed after registration"):
        entry.check_live()


def test_refresh_registers_the_model_as_it_serves_and_names_what_moved() -> None:
    model = Model(n=2, size=2 * MB)
    entry = StorageRegistry().register("target", model)
    assert entry.refresh() == ()  # nothing moved since load
    model.inv_freq = model.inv_freq.to(torch.bfloat16)  # SGLang recasting a cache on first use
    moved = entry.refresh()
    assert len(moved) == 1
    assert moved[0].startswith("'inv_freq' dtype float32 -> bfloat16, storage 0x")
    entry.check_live()  # the registration is the live model now
    assert {r.name: r.dtype for r in entry.records}["inv_freq"] == "bfloat16"
    del model.layers[1]
    assert entry.refresh() == ("'layers.1.weight' disappeared",)


def test_host_release_frees_pages_keeps_addresses_and_hydration_refills(tmp_path: Path) -> None:
    from coldsnap.providers.native import PackDirectory, export_pack, hydrate_pack

    model = Model(n=4, size=16 * MB)
    before = clone_state(model)
    ptrs = {n: p.untyped_storage().data_ptr() for n, p in model.named_parameters()}
    weight_bytes = sum(p.untyped_storage().nbytes() for p in model.parameters())
    export_pack(model, tmp_path / "pack")

    reg = StorageRegistry()
    reg.register("target", model)
    backend = HostDiscardBackend(reg)
    adapter = ColdsnapMemorySaverAdapter(NoopSaver(), live_backing="discard", host=backend)
    r0 = rss()
    adapter.pause("weights")
    dropped = r0 - rss()
    assert backend.last_discarded_bytes >= 0.99 * weight_bytes
    assert dropped >= 0.9 * weight_bytes, f"RSS fell by {dropped} of {weight_bytes} bytes"
    assert all(p.untyped_storage().data_ptr() == ptrs[n] for n, p in model.named_parameters())
    for p in model.parameters():  # whole pages read back as zeros; at most two edge pages stay
        assert int(p.count_nonzero()) * p.element_size() <= 2 * 4096

    adapter.resume("weights")
    hydrate_pack(model, PackDirectory(tmp_path / "pack"))
    after = model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before if k != "inv_freq")
    assert all(p.untyped_storage().data_ptr() == ptrs[n] for n, p in model.named_parameters())


def test_adapter_delegates_everything_to_sglangs_adapter() -> None:
    inner = NoopSaver()
    adapter = ColdsnapMemorySaverAdapter(
        inner, live_backing="cpu", host=HostDiscardBackend(StorageRegistry())
    )
    with adapter.region("weights"):
        pass
    adapter.pause("kv_cache")
    adapter.resume("kv_cache")
    assert inner.calls == [("region", "weights"), ("pause", "kv_cache"), ("resume", "kv_cache")]
    assert adapter.enabled is False and adapter.freed_by() == "none"


def test_an_unknown_backing_is_refused_with_the_accepted_list() -> None:
    with pytest.raises(MemoryBackendError, match="is not one of: discard, cpu, disk"):
        ColdsnapMemorySaverAdapter(NoopSaver(), live_backing="torch_memory_saver")


def test_discard_backing_leaves_cuda_work_to_torch_memory_saver() -> None:
    reg = StorageRegistry()
    backend = HostDiscardBackend(reg)
    adapter = ColdsnapMemorySaverAdapter(
        NoopSaver(enabled=True), live_backing="discard", host=backend
    )
    adapter.pause("weights")
    assert adapter.freed_by() == "torch_memory_saver"
    assert backend.released == set()


def test_discard_pages_only_touches_whole_pages_inside_the_range() -> None:
    buf = torch.ones(3 * 4096 + 100, dtype=torch.uint8)
    addr = buf.data_ptr()
    dropped = discard_pages(addr + 10, 2 * 4096)
    assert dropped in (4096, 2 * 4096)
    assert buf[:10].all() and buf[-100:].all()  # bytes outside whole pages are kept
    assert discard_pages(addr, 100) == 0
