"""The release path the way CUDA needs it, in each scheduler process (one per TP rank).

Three hooks, outside the scheduler hooks of `_scheduler` (registered after them, so they wrap
them):

- **Gate.** From a release of `weights` or `kv_cache` until both are resumed (and the weights
  refilled: the inner resume hook hydrates before it returns, and its status says `ok`), the
  scheduler's batch selection (`Scheduler.get_next_batch_to_run`) runs no batch: requests that
  arrive wait in the scheduler's queue. SGLang keeps scheduling while its regions are released,
  and the first GPU touch of a new request (`write_req_to_token_pool_triton` on `req_to_token`,
  which lives in the `kv_cache` region) then kills the scheduler; with only the weights released
  it would answer from zeroed weights. The flag lives in the process, so it is in an n610 image
  and still holds after a restore, until the restore's resume.
- **Measure.** Around the weight updater's release: device memory before and after
  (`torch.cuda.mem_get_info`, device-wide, and `torch.cuda.memory_reserved`), and after the
  release, for each released region, the bytes of its tensors whose device pointer is still
  mapped (`cuPointerGetAttribute(DEVICE_POINTER)`, what Triton checks): the parameters of every
  model for `weights`; `req_to_token` and the KV buffers of every runner (the target's and
  each draft's) for `kv_cache`. A region is resident
  when any of its bytes is; the record names it and the bytes. The plugin does not raise inside
  the scheduler (SGLang would end it); the engine adapter reads the record and refuses the
  capture (coldsnap.engines.sglang, `release_memory`).
- **Pinned host cache.** After the release, before the CUDA lock:
  `torch.cuda.synchronize(); torch._C._host_emptyCache()`, so that no cached pinned block with an
  event recorded before a checkpoint is queried after a restore (cheap: under a millisecond).
- **Device cache.** Then `torch.cuda.empty_cache()`: the caching allocator's free blocks would
  otherwise be checkpointed (into the image) and restored with every restore; recorded as
  `device_cache` (reserved before and after, allocated).

The record is the status field `cuda_release` (see `REPORT_FIELD`), written with the event
`cuda_release_measured`. Its keys are read by the engine adapter through coldsnap._wire's
status path: `at` (wall time), `device` ("cuda:N" or "cpu"), `tags`, `regions` (tag ->
{bytes, resident_bytes, tensors}), `resident` (tag -> resident bytes, only regions with some),
`device_used_before`, `device_used_after`, `device_freed`, `reserved_before`, `reserved_after`,
`device_used_released` (in use right after SGLang's release, before the caches below are
emptied: `device_used_before` minus it is what the release itself freed, the only measure of
the `cuda_graph` region), `residual_device_bytes` (device memory in use after the release,
device-wide), `host_cache`,
`device_cache`,
`error` (a measurement that could not be made; the engine refuses on it).
"""

from __future__ import annotations

import ctypes
import logging
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from coldsnap._wire import KV_CACHE, MEMORY_TAGS, WEIGHTS
from coldsnap._wire import EngineSettings as Settings

from ._records import StatusFile
from ._scheduler import weight_runners
from ._storages import REGISTRY, StorageRegistry

logger = logging.getLogger("coldsnap.plugin")

SG = "sglang.srt"
WU = f"{SG}.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
NEXT_BATCH = f"{SG}.managers.scheduler.Scheduler.get_next_batch_to_run"
REPORT_FIELD = "cuda_release"
GATED_TAGS = (WEIGHTS, KV_CACHE)
_CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3

Mapped = Callable[[int], bool]
"""(device address) -> whether it is mapped now."""


def targets(role: str, settings: Settings, status: StatusFile) -> list[tuple[str, str, Any]]:
    """(target, hook type, hook) of this process: the scheduler's only, when the plugin is on."""
    if role != "scheduler" or not settings.active:
        return []
    return CudaRelease(status).targets()


class _Libcuda:
    """`cuPointerGetAttribute` through the driver library, loaded on first use."""

    lib: Any = None

    def mapped(self, address: int) -> bool:
        if self.lib is None:
            lib = ctypes.CDLL("libcuda.so.1")
            lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
            lib.cuPointerGetAttribute.restype = ctypes.c_int
            self.lib = lib
        out = ctypes.c_uint64()
        rc = self.lib.cuPointerGetAttribute(
            ctypes.byref(out), _CU_POINTER_ATTRIBUTE_DEVICE_POINTER, address
        )
        return rc == 0


_LIBCUDA = _Libcuda()


class CudaRelease:
    """The gate, the measurement and the host-cache step of one scheduler process."""

    def __init__(
        self,
        status: StatusFile,
        registry: StorageRegistry = REGISTRY,
        *,
        mapped: Mapped | None = None,
        torch_module: Any = None,
        next_batch_plan: Callable[..., Any] | None = None,
    ) -> None:
        self.status = status
        self.registry = registry
        self._mapped = mapped or _LIBCUDA.mapped
        self._torch = torch_module
        self._plan = next_batch_plan
        self.gated = False
        self.held_batches = 0

    @property
    def torch(self) -> Any:
        if self._torch is None:
            import torch

            self._torch = torch
        return self._torch

    def targets(self) -> list[tuple[str, str, Any]]:
        return [
            (f"{WU}.release_memory_occupation", "AROUND", self.around_release),
            (f"{WU}.resume_memory_occupation", "AROUND", self.around_resume),
            (NEXT_BATCH, "AROUND", self.around_next_batch),
        ]

    # ---------------------------------------------------------------- gate
    def around_next_batch(self, original: Any, scheduler: Any, *args: Any, **kw: Any) -> Any:
        """While gated: no batch (the requests wait in the queue), the running batch as it is
        (empty: a release needs an idle scheduler)."""
        if not self.gated:
            return original(scheduler, *args, **kw)
        if self.held_batches == 0:
            logger.info("coldsnap: memory released; requests wait until it is resumed")
        self.held_batches += 1
        if self._plan is None:
            from sglang.srt.managers.schedule_batch import NextBatchPlan

            self._plan = NextBatchPlan
        running = kw["running_batch"] if "running_batch" in kw else args[0]
        return self._plan(batch_to_run=None, running_batch=running)

    def _close(self) -> None:
        self.gated = True
        self.held_batches = 0
        self.status.update("gate_closed", request_gate="closed")

    def _open(self) -> None:
        self.gated = False
        self.status.update("gate_opened", request_gate="open", held_batches=self.held_batches)

    # ---------------------------------------------------------------- release
    def around_release(self, original: Any, mgr: Any, recv_req: Any, *args: Any, **kw: Any) -> Any:
        tags = _tags(recv_req)
        started = time.time()
        before: dict[str, Any] = {}
        before_error = None
        try:
            before = self._device_memory(mgr)
        except Exception as exc:  # recorded; the engine refuses a release it cannot measure
            before_error = _err(exc)
        result = original(mgr, recv_req, *args, **kw)
        offloaded = set(getattr(mgr, "offload_tags", ()) or ())
        if offloaded & set(GATED_TAGS):
            self._close()
        try:
            report = self._after_release(mgr, tags, before, started)
            if before_error is not None:
                report["error"] = f"measuring before the release: {before_error}"
        except Exception as exc:
            logger.error("coldsnap: release measurement failed: %s", traceback.format_exc())
            report = {"at": started, "tags": tags, "error": _err(exc)}
        # A release the scheduler refused keeps that verdict as its last event: the health
        # gate reads it to let an engine that released nothing serve on.
        events = self.status.record.get("events") or [{}]
        refused = events[-1].get("event") == "release_failed"
        self.status.update(None if refused else "cuda_release_measured", **{REPORT_FIELD: report})
        return result

    def _after_release(
        self, mgr: Any, tags: list[str], before: dict[str, Any], started: float
    ) -> dict[str, Any]:
        device = _device_of(mgr.tp_worker.model_runner.model)
        report: dict[str, Any] = {"at": started, "tags": tags, "device": device, "error": None}
        if device == "cpu":
            # No device memory: nothing here could stay resident on a GPU.
            report.update(regions={}, resident={}, residual_device_bytes=0, host_cache=None)
            return report
        regions = self._regions(mgr, tags)
        torch = self.torch
        torch.cuda.synchronize()
        # before any cache is emptied: what SGLang's release freed by itself (the pages the
        # memory saver unmapped; the only evidence for the cuda_graph region, whose memory no
        # tensor the plugin can name lies in)
        released = self._device_memory(mgr)
        measured: dict[str, dict[str, int]] = {}
        for tag, tensors in regions.items():
            total = resident = 0
            storages = _extents(t for t in tensors if t.device.type == "cuda")
            for address, nbytes in storages:
                total += nbytes
                if self._mapped(address):
                    resident += nbytes
            measured[tag] = {"bytes": total, "resident_bytes": resident, "tensors": len(storages)}
        host_cache = self._empty_host_cache()
        device_cache = self._empty_device_cache()
        after = self._device_memory(mgr)
        report.update(
            regions=measured,
            resident={t: m["resident_bytes"] for t, m in measured.items() if m["resident_bytes"]},
            device_used_before=before.get("used"),
            device_used_after=after["used"],
            device_used_released=released.get("used"),
            device_freed=(before["used"] - after["used"]) if "used" in before else None,
            reserved_before=before.get("reserved"),
            reserved_after=after["reserved"],
            residual_device_bytes=after["used"],
            host_cache=host_cache,
            device_cache=device_cache,
        )
        missing = [t for t in tags if t in GATED_TAGS and not measured.get(t, {}).get("tensors")]
        if missing:
            report["error"] = (
                f"found no device tensors of region(s) {', '.join(missing)} to check "
                "(this SGLang build keeps them where coldsnap does not look)"
            )
        return report

    def _device_memory(self, mgr: Any) -> dict[str, Any]:
        torch = self.torch
        if not torch.cuda.is_available():
            return {}
        free, total = torch.cuda.mem_get_info()
        return {"used": int(total - free), "reserved": int(torch.cuda.memory_reserved())}

    def _empty_host_cache(self) -> dict[str, Any]:
        """Drops torch's cached pinned host blocks (their events predate any checkpoint)."""
        torch = self.torch
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        torch._C._host_emptyCache()
        return {"emptied": True, "seconds": round(time.perf_counter() - t0, 6)}

    def _empty_device_cache(self) -> dict[str, Any]:
        """Returns the caching allocator's free blocks to the driver: whatever stays mapped
        is checkpointed into the image and brought back on every restore. Blocks in use, and
        the private pools of captured CUDA graphs, stay; the allocator maps memory again when
        serving needs it."""
        cuda = self.torch.cuda
        t0 = time.perf_counter()
        reserved = int(cuda.memory_reserved())
        cuda.empty_cache()
        return {
            "reserved_before": reserved,
            "reserved_after": int(cuda.memory_reserved()),
            "allocated": int(cuda.memory_allocated()),
            "seconds": round(time.perf_counter() - t0, 6),
        }

    def _regions(self, mgr: Any, tags: list[str]) -> dict[str, list[Any]]:
        """Released tag -> the tensors that must not stay mapped."""
        out: dict[str, list[Any]] = {}
        runner = mgr.tp_worker.model_runner
        if WEIGHTS in tags:
            models = [e.model for e in self.registry.models()] or [runner.model]
            out[WEIGHTS] = [p for m in models for p in m.parameters()]
        if KV_CACHE in tags:
            # every runner's pool: a speculative draft has a KV pool of its own (sharing the
            # target's req_to_token), which the same release must free
            out[KV_CACHE] = [t for _, r in weight_runners(mgr) for t in _kv_tensors(r)]
        return out

    # ---------------------------------------------------------------- resume
    def around_resume(self, original: Any, mgr: Any, recv_req: Any, *args: Any, **kw: Any) -> Any:
        result = original(mgr, recv_req, *args, **kw)
        offloaded = set(getattr(mgr, "offload_tags", ()) or ())
        if self.gated and not offloaded & set(GATED_TAGS):
            # The inner hook says `ok` only once the weights are refilled (or reloaded).
            if self.status.record.get("outcome") == "ok":
                self._open()
            else:
                self.status.update(
                    "gate_kept_closed",
                    request_gate="closed",
                    gate_reason=f"resume outcome {self.status.record.get('outcome')!r}",
                )
        return result


def _tags(recv_req: Any) -> list[str]:
    tags = getattr(recv_req, "tags", None)
    return list(tags) if tags else list(MEMORY_TAGS)


def _kv_tensors(runner: Any) -> list[Any]:
    """`req_to_token` and the KV buffers (MHA: k_buffer and v_buffer; MLA: kv_buffer)."""
    out: list[Any] = []
    pool = getattr(runner, "req_to_token_pool", None)
    if pool is not None and getattr(pool, "req_to_token", None) is not None:
        out.append(pool.req_to_token)
    kv = getattr(runner, "token_to_kv_pool", None)
    for name in ("k_buffer", "v_buffer", "kv_buffer"):
        value = getattr(kv, name, None)
        if value is None:
            continue
        out.extend(value if isinstance(value, list | tuple) else [value])
    return out


def _extents(tensors: Iterable[Any]) -> list[tuple[int, int]]:
    """(storage address, storage bytes) of each distinct storage among `tensors`."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t.numel() == 0:
            continue
        storage = t.untyped_storage()
        seen.setdefault(int(storage.data_ptr()), int(storage.nbytes()))
    return sorted(seen.items())


def _device_of(model: Any) -> str:
    """ "cuda:N" when the target model's first parameter is on a GPU, else "cpu"."""
    for p in model.parameters():
        return str(p.device) if p.device.type == "cuda" else "cpu"
    return "cpu"


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


__all__ = ["GATED_TAGS", "REPORT_FIELD", "CudaRelease", "targets"]
