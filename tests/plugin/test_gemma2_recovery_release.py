"""A release must not unmap memory that launched kernels still read.

SGLang 0.5.17's `release_memory_occupation` pauses the KV cache, flushes, takes a device copy
of every model buffer (`_export_static_state`: one asynchronous clone each; a Gemma 2 has one
per norm besides its rotary cache and embedding normalizer), meets the other ranks on the CPU
group and pauses the weights, then synchronizes. torch_memory_saver's pause unmaps a region at
once, without waiting for the device, so a clone still queued when its buffer's pages go
faults, and the illegal memory access surfaces at that last synchronize (seen on the H200
with a tiny Gemma 2: the capture failed in its refill rehearsal and its compensation could not
resume the dead context). The plugin's adapter therefore waits for the device before each
pause. The fakes below keep 0.5.17's order of operations; the device runs a kernel only when
synchronized, as a busy GPU may.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import coldsnap.plugin._memory as _memory
import coldsnap.plugin._scheduler as sched
from coldsnap.plugin import ColdsnapMemorySaverAdapter, Settings, StatusFile, StorageRegistry

ILLEGAL = "CUDA error: an illegal memory access was encountered"


class Device:
    """Launched kernels run at the next synchronize. A region unmapped while a launched kernel
    still reads it faults that kernel; like CUDA, the fault is sticky and every later
    synchronize reports it."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, str]] = []  # (kernel, region it reads)
        self.unmapped: set[str] = set()
        self.faults: list[str] = []
        self.log: list[str] = []

    def launch(self, kernel: str, region: str) -> None:
        self.pending.append((kernel, region))

    def unmap(self, region: str) -> None:
        self.log.append(f"unmap {region}")
        self.unmapped.add(region)

    def map(self, region: str) -> None:
        self.unmapped.discard(region)

    def synchronize(self) -> None:
        self.log.append("synchronize")
        self.faults += [k for k, region in self.pending if region in self.unmapped]
        self.pending.clear()
        if self.faults:
            raise RuntimeError(f"{ILLEGAL} ({', '.join(self.faults)})")


class MemorySaver:
    """SGLang's adapter over torch_memory_saver: pause unmaps the tag's pages at once."""

    enabled = True

    def __init__(self, device: Device) -> None:
        self.device = device

    def pause(self, tag: str) -> None:
        self.device.unmap(tag)

    def resume(self, tag: str) -> None:
        self.device.map(tag)


class Gemma2(torch.nn.Module):
    """The buffers of a Gemma 2 that SGLang's release copies: the embedding normalizer, the
    rotary cache and each norm's precomputed `weight + 1`."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(8, 4, dtype=torch.bfloat16))
        self.register_buffer("normalizer", torch.tensor(2.0, dtype=torch.bfloat16))
        self.register_buffer("cos_sin_cache", torch.rand(16, 4), persistent=False)
        for i in range(4):
            self.register_buffer(f"gemma_weight_{i}", torch.ones(4), persistent=False)


class WeightUpdater:
    """SchedulerWeightUpdaterManager.release_memory_occupation of SGLang 0.5.17, on `device`.
    `forward_tail` is a kernel of the overlapped forward stream still reading the KV cache
    when the release starts."""

    def __init__(self, adapter: Any, device: Device, model: torch.nn.Module) -> None:
        self.tp_cpu_group = None
        self.offload_tags: set[str] = set()
        self.memory_saver_adapter = adapter
        self.device = device
        self.model = model

    def release_memory_occupation(self, mgr: WeightUpdater, recv_req: Any) -> str:
        tags = recv_req.tags
        for tag in tags:
            self.offload_tags.add(tag)
        if "kv_cache" in tags:
            self.memory_saver_adapter.pause("kv_cache")
            self.device.launch("flush_cache", "scratch")
        if "weights" in tags:
            for name, _ in self.model.named_buffers():  # _export_static_state
                self.device.launch(f"clone {name}", "weights")
            # torch.distributed.barrier(tp_cpu_group): host only
            self.memory_saver_adapter.pause("weights")
        if "cuda_graph" in tags:
            self.memory_saver_adapter.pause("cuda_graph")
        self.device.synchronize()
        return "released"


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter believes it runs on CUDA; a single process: no TP group, no NCCL."""
    monkeypatch.setattr(_memory, "_cuda_available", lambda: True)
    monkeypatch.setattr(sched, "_tp_group", lambda: None)
    monkeypatch.setattr(sched._nccl, "prepare", lambda group: None)


def release(tmp_path: Path, device: Device) -> tuple[sched.SchedulerHooks, WeightUpdater, Any]:
    """A release of the KV cache and the weights through the plugin's scheduler hook."""
    from sglang.srt.managers import io_struct

    model, registry = Gemma2(), StorageRegistry()
    registry.register("target", model)
    settings = Settings(mode="capture", runtime_dir=tmp_path, keep_residual=False)
    h = sched.SchedulerHooks(settings, StatusFile(tmp_path, "scheduler-tp0", {}), registry)
    adapter = ColdsnapMemorySaverAdapter(
        MemorySaver(device), live_backing="discard", synchronize=device.synchronize
    )
    h.adapters.append(adapter)
    mgr = WeightUpdater(adapter, device, model)
    req = io_struct.ReleaseMemoryOccupationReqInput(tags=["kv_cache", "weights"], rid="op1")
    return h, mgr, h.around_release(mgr.release_memory_occupation, mgr, req)


@pytest.mark.parametrize("forward_tail", [False, True], ids=["buffer-copies", "forward-tail"])
def test_no_region_is_unmapped_under_a_kernel_still_reading_it(
    tmp_path: Path, sglang_cpu: None, on_cuda: None, forward_tail: bool
) -> None:
    device = Device()
    if forward_tail:
        device.launch("decode step", "kv_cache")
    h, mgr, out = release(tmp_path, device)
    assert device.faults == []
    assert out == "released"
    record = h.status.record
    assert (record["outcome"], record["error"]) == ("ok", None), record["error"]
    assert record["released_tags"] == ["kv_cache", "weights"]
    assert mgr.offload_tags == {"kv_cache", "weights"}
    # each unmap comes right after the device finished everything launched before it
    log = device.log
    assert [log[i - 1] for i, e in enumerate(log) if e.startswith("unmap")] == ["synchronize"] * 2


def test_a_fault_that_already_happened_fails_the_release_before_any_pause(
    tmp_path: Path, sglang_cpu: None, on_cuda: None
) -> None:
    """The device context is already dead (an earlier kernel faulted): the release fails at its
    first pause, before anything is unmapped, so nothing stays marked released and the error
    names the fault."""
    device = Device()
    device.faults.append("an earlier kernel")
    h, mgr, out = release(tmp_path, device)
    assert type(out).__name__ == "ReleaseMemoryOccupationReqOutput"
    assert device.unmapped == set()
    assert mgr.offload_tags == set()
    record = h.status.record
    assert record["outcome"] == "failed" and ILLEGAL in record["error"]
    assert record["events"][-1]["event"] == "release_failed"


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "cuda-without-saver"])
def test_no_wait_where_nothing_is_unmapped(monkeypatch: pytest.MonkeyPatch, cuda: bool) -> None:
    """On CPU, or on CUDA without the memory saver, a pause unmaps nothing: no device wait."""
    monkeypatch.setattr(_memory, "_cuda_available", lambda: cuda)
    waits: list[None] = []

    class Disabled:
        enabled = False

        def pause(self, tag: str) -> None:
            pass

    adapter = ColdsnapMemorySaverAdapter(
        Disabled(),
        live_backing="discard",
        host=_memory.HostDiscardBackend(StorageRegistry()),
        synchronize=lambda: waits.append(None),
    )
    adapter.pause("kv_cache")
    assert waits == []
