"""The CUDA release path in the scheduler (coldsnap.plugin._cuda_release), with fakes on CPU: the
request gate from release to a good resume, the measurement of what stays resident after a
release (regions and bytes), the pinned host cache emptied, and the memory adapter refusing
backings that free no device memory on CUDA."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coldsnap._wire import status_path
from coldsnap.plugin import (
    ColdsnapMemorySaverAdapter,
    MemoryBackendError,
    Settings,
    StorageRegistry,
    _memory,
)
from coldsnap.plugin._cuda_release import REPORT_FIELD, CudaRelease, targets
from coldsnap.plugin._records import StatusFile

GIB = 2**30


class Device:
    def __init__(self, kind: str) -> None:
        self.type = kind

    def __str__(self) -> str:
        return f"{self.type}:0" if self.type == "cuda" else self.type


class Storage:
    def __init__(self, ptr: int, nbytes: int) -> None:
        self.ptr, self.size = ptr, nbytes

    def data_ptr(self) -> int:
        return self.ptr

    def nbytes(self) -> int:
        return self.size


class FakeTensor:
    """What the measurement reads of a tensor: device, numel, storage address and size."""

    def __init__(self, ptr: int, nbytes: int, device: str = "cuda") -> None:
        self.device = Device(device)
        self.storage = Storage(ptr, nbytes)

    def numel(self) -> int:
        return self.storage.size // 2

    def untyped_storage(self) -> Storage:
        return self.storage


class Model:
    def __init__(self, *params: FakeTensor) -> None:
        self.params = params

    def parameters(self) -> Any:
        return iter(self.params)


class FakeCuda:
    """torch.cuda as the measurement uses it; `used` is what mem_get_info reports in use."""

    def __init__(self, used: int) -> None:
        self.used = used
        self.total = 141 * GIB
        self.calls: list[str] = []

    def is_available(self) -> bool:
        return True

    def mem_get_info(self) -> tuple[int, int]:
        return self.total - self.used, self.total

    def memory_reserved(self) -> int:
        return GIB if "empty_cache" in self.calls else 3 * GIB

    def memory_allocated(self) -> int:
        return GIB // 2

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")

    def synchronize(self) -> None:
        self.calls.append("synchronize")


class FakeTorch:
    def __init__(self, used: int) -> None:
        self.cuda = FakeCuda(used)
        self._C = SimpleNamespace(_host_emptyCache=lambda: self.cuda.calls.append("host_empty"))


class Weights:
    """Two parameters on one storage, one on another; a KV pool with k/v buffers and
    req_to_token (each on its own storage)."""

    def __init__(self, device: str = "cuda") -> None:
        shared = FakeTensor(0x1000, GIB, device)
        self.model = Model(shared, shared, FakeTensor(0x9000_0000, GIB // 2, device))
        self.kv = SimpleNamespace(
            k_buffer=[FakeTensor(0x10_0000_0000, 4 * GIB, device)],
            v_buffer=[FakeTensor(0x20_0000_0000, 4 * GIB, device)],
        )
        self.req_to_token = FakeTensor(0x30_0000_0000, 64 << 20, device)


class Manager:
    """The weight updater manager: the release marks its tags offloaded and, when `frees`,
    unmaps the released regions' storages (and lowers device memory in use)."""

    def __init__(self, w: Weights, torch: FakeTorch, mapped: set[int], *, frees: bool) -> None:
        runner = SimpleNamespace(
            model=w.model,
            token_to_kv_pool=w.kv,
            req_to_token_pool=SimpleNamespace(req_to_token=w.req_to_token),
        )
        self.tp_worker = SimpleNamespace(model_runner=runner)
        self.draft_worker: Any = None  # a speculative worker (test_spec_kv_residency.py)
        self.offload_tags: set[str] = set()
        self.w, self.torch, self.mapped, self.frees = w, torch, mapped, frees

    def _select_runners(self, selector: str) -> list[tuple[str, Any]]:
        """0.5.23's runner selector (0.5.17: tp_worker and draft_worker, read directly)."""
        return [("target", self.tp_worker.model_runner)]

    def release(self, recv_req: Any) -> str:
        tags = recv_req.tags or ["kv_cache", "weights", "cuda_graph"]
        self.offload_tags |= set(tags)
        if self.frees:
            if "weights" in tags:
                for p in self.w.model.params:
                    self.mapped.discard(p.storage.ptr)
            if "kv_cache" in tags:
                for t in (*self.w.kv.k_buffer, *self.w.kv.v_buffer, self.w.req_to_token):
                    self.mapped.discard(t.storage.ptr)
            self.torch.cuda.used = GIB + 7
        return "ReleaseOutput"

    def resume(self, recv_req: Any) -> str:
        self.offload_tags -= set(recv_req.tags or ["kv_cache", "weights", "cuda_graph"])
        return "ResumeOutput"


def setup(
    tmp_path: Path, *, frees: bool = True, device: str = "cuda"
) -> tuple[CudaRelease, Manager, StatusFile]:
    w = Weights(device)
    torch = FakeTorch(used=20 * GIB)
    mapped = {
        t.storage.ptr for t in (*w.model.params, *w.kv.k_buffer, *w.kv.v_buffer, w.req_to_token)
    }
    status = StatusFile(tmp_path, "scheduler-tp0", {"role": "scheduler"})
    cr = CudaRelease(
        status,
        StorageRegistry(),
        mapped=mapped.__contains__,
        torch_module=torch,
        next_batch_plan=lambda **kw: ("plan", kw),
    )
    return cr, Manager(w, torch, mapped, frees=frees), status


def release(cr: CudaRelease, mgr: Manager, tags: list[str] | None = None) -> Any:
    return cr.around_release(lambda m, r: m.release(r), mgr, SimpleNamespace(tags=tags))


def resume(cr: CudaRelease, mgr: Manager, status: StatusFile, outcome: str = "ok") -> Any:
    def inner(m: Manager, r: Any) -> str:
        status.update("resumed", outcome=outcome)  # what the inner scheduler hook writes
        return m.resume(r)

    return cr.around_resume(inner, mgr, SimpleNamespace(tags=None))


def written(tmp_path: Path) -> dict[str, Any]:
    return json.loads(status_path(tmp_path, "scheduler-tp0").read_text())[REPORT_FIELD]


def test_a_release_that_frees_its_regions_records_the_residual(tmp_path: Path) -> None:
    cr, mgr, _ = setup(tmp_path)
    assert release(cr, mgr, ["kv_cache", "weights"]) == "ReleaseOutput"
    report = written(tmp_path)
    assert report["device"] == "cuda:0"
    assert report["resident"] == {}
    assert report["regions"]["weights"] == {
        "bytes": GIB + GIB // 2,
        "resident_bytes": 0,
        "tensors": 2,
    }
    assert report["regions"]["kv_cache"]["bytes"] == 8 * GIB + (64 << 20)
    assert report["device_used_before"] == 20 * GIB
    assert report["residual_device_bytes"] == report["device_used_after"] == GIB + 7
    assert report["device_freed"] == 19 * GIB - 7
    assert report["error"] is None
    assert report["host_cache"]["emptied"] is True
    # the pinned host cache is emptied after a synchronize, then the allocator's free blocks
    assert mgr.torch.cuda.calls[-3:] == ["synchronize", "host_empty", "empty_cache"]
    cache = report["device_cache"]
    assert (cache["reserved_before"], cache["reserved_after"]) == (3 * GIB, GIB)
    assert cache["allocated"] == GIB // 2
    assert report["reserved_after"] == GIB  # measured after the cache was emptied


def test_with_the_memory_saver_off_the_record_names_the_resident_regions(tmp_path: Path) -> None:
    cr, mgr, _ = setup(tmp_path, frees=False)
    release(cr, mgr, ["kv_cache", "weights"])
    report = written(tmp_path)
    assert report["resident"] == {"weights": GIB + GIB // 2, "kv_cache": 8 * GIB + (64 << 20)}
    assert report["device_freed"] == 0
    assert report["residual_device_bytes"] == 20 * GIB


def test_only_the_released_regions_are_checked(tmp_path: Path) -> None:
    cr, mgr, _ = setup(tmp_path, frees=False)
    release(cr, mgr, ["cuda_graph"])
    report = written(tmp_path)
    assert report["regions"] == {} and report["resident"] == {}
    assert not cr.gated  # nothing the requests need was released


def test_what_the_release_itself_freed_is_measured_before_any_cache_is_emptied(
    tmp_path: Path,
) -> None:
    """The graph region holds no tensor the plugin can name: the device memory its release
    unmapped is the evidence (device_used_before - device_used_released), and emptying the
    allocator's cache afterwards must not count as the release's."""
    cr, mgr, _ = setup(tmp_path, frees=False)  # releases the graph region: frees 1 GiB
    cuda = mgr.torch.cuda

    def graph_release(m: Manager, r: Any) -> str:
        cuda.used -= GIB
        return m.release(r)

    def empty_cache() -> None:  # the allocator returns 2 GiB of free blocks
        cuda.calls.append("empty_cache")
        cuda.used -= 2 * GIB

    cuda.empty_cache = empty_cache  # type: ignore[method-assign]
    cr.around_release(graph_release, mgr, SimpleNamespace(tags=["cuda_graph"]))
    report = written(tmp_path)
    assert report["device_used_before"] - report["device_used_released"] == GIB
    assert report["device_freed"] == 3 * GIB


def test_a_region_with_no_tensors_found_is_an_error_not_a_pass(tmp_path: Path) -> None:
    cr, mgr, _ = setup(tmp_path)
    mgr.tp_worker.model_runner.token_to_kv_pool = SimpleNamespace()
    mgr.tp_worker.model_runner.req_to_token_pool = None
    release(cr, mgr, ["kv_cache", "weights"])
    assert "found no device tensors of region(s) kv_cache" in written(tmp_path)["error"]


def test_a_measurement_that_raises_is_recorded_and_the_release_still_returns(
    tmp_path: Path,
) -> None:
    cr, mgr, _ = setup(tmp_path)
    del mgr.tp_worker.model_runner.model  # SGLang moved it: cannot measure
    assert release(cr, mgr) == "ReleaseOutput"  # never raise inside the scheduler
    assert written(tmp_path)["error"].startswith("AttributeError")


def test_on_cpu_the_record_says_cpu_and_no_device_bytes(tmp_path: Path) -> None:
    cr, mgr, _ = setup(tmp_path, device="cpu")
    release(cr, mgr)
    report = written(tmp_path)
    assert report["device"] == "cpu"
    assert report["residual_device_bytes"] == 0
    assert mgr.torch.cuda.calls == []  # no CUDA call on a CPU engine


def test_a_refused_release_keeps_the_refusal_as_its_last_event(tmp_path: Path) -> None:
    """The health gate lets an engine serve on after a release every rank refused before
    releasing anything, reading each rank's last event; the measurement must not cover it."""
    cr, mgr, status = setup(tmp_path, device="cpu")

    def refused(m: Manager, r: Any) -> str:
        status.update("release_failed", outcome="failed", error="refused")  # the inner hook's
        return "ReleaseOutput"

    cr.around_release(refused, mgr, SimpleNamespace(tags=None))
    record = json.loads(status_path(tmp_path, "scheduler-tp0").read_text())
    assert record["events"][-1]["event"] == "release_failed"
    assert record[REPORT_FIELD]["device"] == "cpu"  # measured all the same


def test_requests_wait_from_the_release_until_a_good_resume(tmp_path: Path) -> None:
    cr, mgr, status = setup(tmp_path)
    batches: list[Any] = []

    def select(**kw: Any) -> Any:
        return cr.around_next_batch(lambda sched, **k: batches.append(k) or "batch", object(), **kw)

    assert select(running_batch="rb", last_batch=None) == "batch"
    release(cr, mgr)
    assert cr.gated and status.record["request_gate"] == "closed"
    held = select(running_batch="rb", last_batch=None)
    assert held == ("plan", {"batch_to_run": None, "running_batch": "rb"})
    assert len(batches) == 1  # SGLang's batch selection did not run
    # a refused or failed resume keeps the gate closed: the weights are not valid
    mgr.offload_tags = {"kv_cache", "weights"}
    resume(cr, mgr, status, outcome="failed")
    assert cr.gated and status.record["gate_reason"] == "resume outcome 'failed'"
    mgr.offload_tags = {"kv_cache", "weights"}
    resume(cr, mgr, status)
    assert not cr.gated and status.record["request_gate"] == "open"
    assert status.record["held_batches"] == 1
    assert select(running_batch="rb", last_batch=None) == "batch"


def test_the_gate_holds_while_only_part_is_resumed(tmp_path: Path) -> None:
    cr, mgr, status = setup(tmp_path)
    release(cr, mgr, ["kv_cache", "weights"])

    def inner(m: Manager, r: Any) -> str:
        status.update("resumed", outcome="ok")
        return m.resume(r)

    cr.around_resume(inner, mgr, SimpleNamespace(tags=["weights"]))
    assert cr.gated  # kv_cache (req_to_token) is still unmapped
    cr.around_resume(inner, mgr, SimpleNamespace(tags=["kv_cache"]))
    assert not cr.gated


def test_targets_only_in_an_active_scheduler(tmp_path: Path) -> None:
    status = StatusFile(tmp_path, "main", {})
    on = Settings(mode="capture", runtime_dir=tmp_path)
    assert targets("main", on, status) == []
    assert targets("scheduler", Settings(), status) == []
    names = [t for t, _k, _h in targets("scheduler", on, status)]
    assert names == [
        "sglang.srt.managers.scheduler_components.weight_updater."
        "SchedulerWeightUpdaterManager.release_memory_occupation",
        "sglang.srt.managers.scheduler_components.weight_updater."
        "SchedulerWeightUpdaterManager.resume_memory_occupation",
        "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run",
    ]


def test_the_hooks_land_on_the_installed_sglang(tmp_path: Path, clean_hook_registry: Any) -> None:
    from sglang.srt.managers.schedule_batch import NextBatchPlan
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from coldsnap.plugin import hook_landed

    cr = CudaRelease(StatusFile(tmp_path, "scheduler-tp0", {}), StorageRegistry())
    for target, kind, hook in cr.targets():
        HookRegistry.register(target, hook, getattr(HookType, kind))
    HookRegistry.apply_hooks()
    assert all(hook_landed(t, h) for t, _k, h in cr.targets())
    cr.gated = True
    plan = cr.around_next_batch(lambda *a, **k: None, object(), running_batch=None, last_batch=None)
    assert isinstance(plan, NextBatchPlan) and plan.batch_to_run is None


class Saver:
    enabled = False

    def pause(self, tag: str) -> None:
        pass

    def resume(self, tag: str) -> None:
        pass


@pytest.mark.parametrize("backing", ["auto", "host_discard", "torch_memory_saver", "none"])
def test_backings_other_than_discard_cpu_disk_are_refused(backing: str) -> None:
    with pytest.raises(MemoryBackendError, match="is not one of: discard, cpu, disk"):
        ColdsnapMemorySaverAdapter(Saver(), live_backing=backing)


@pytest.mark.parametrize("backing", ["discard", "disk"])
def test_on_cuda_discard_never_falls_back_to_host_discard(
    monkeypatch: pytest.MonkeyPatch, backing: str
) -> None:
    monkeypatch.setattr(_memory, "_cuda_available", lambda: True)
    adapter = ColdsnapMemorySaverAdapter(Saver(), live_backing=backing)
    adapter.pause("weights")
    assert adapter.freed_by() == "none"  # measured at release, and refused there


def test_on_cuda_cpu_backing_needs_the_saver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "_cuda_available", lambda: True)
    with pytest.raises(MemoryBackendError, match=r"LIVE_BACKING=cpu on CUDA .* not enabled"):
        ColdsnapMemorySaverAdapter(Saver(), live_backing="cpu").pause("weights")
