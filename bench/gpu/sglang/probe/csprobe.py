"""A probe SGLang plugin (bench only, not the product): runs code inside SGLang 0.5.17's scheduler
around /release_memory_occupation and /resume_memory_occupation, so that the release path of a
snapshot can be studied without coldsnap's plugin (which refuses 0.5.17).

Loaded through the entry-point group `sglang.srt.plugins` (the `csprobe-0.0.dist-info` folder
beside this file; put this folder on PYTHONPATH and set SGLANG_PLUGINS=csprobe).

What it does is read, at each release and resume, from $CSPROBE_DIR/control.json (default
/dev/shm/csprobe), a file outside the process, so it can differ between restores of one image:
  save_weights      before a release of `weights`: copy every parameter to a host file, once
  refill            after a resume of `weights`: copy that file back into the parameters
  host_empty_cache  after the release: torch.cuda.synchronize(); torch._C._host_emptyCache()
  device_empty_cache after the release: torch.cuda.empty_cache()
  no_pin            from this resume on, SGLang's is_pin_memory_available() answers False
  diag              (default true) report which device pointers are mapped (cuPointerGetAttribute,
                    as Triton's launcher checks them) after release and resume
  quiet             make no CUDA call of the probe's own (no memory figures, no synchronize, no
                    diag, no weights), except host_empty_cache at release and
                    sync_after_resume (torch.cuda.synchronize() after the resume) when asked
Every event goes as one JSON line to $CSPROBE_DIR/events.jsonl and to stderr ("[csprobe]").
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
from pathlib import Path

PROBE_DIR = Path(os.environ.get("CSPROBE_DIR", "/dev/shm/csprobe"))
_STATE = {"no_pin": False, "hooks": []}

WU = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"


def _log(event: str, **info) -> None:
    rec = {"event": event, "pid": os.getpid(), "wall": time.time(), **info}
    line = json.dumps(rec, default=str)
    print(f"[csprobe] {line}", file=sys.stderr, flush=True)
    try:
        PROBE_DIR.mkdir(parents=True, exist_ok=True)
        with open(PROBE_DIR / "events.jsonl", "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


def _control() -> dict:
    try:
        return json.loads((PROBE_DIR / "control.json").read_text())
    except (OSError, ValueError):
        return {}


def _tags(recv_req) -> list[str]:
    from sglang.srt.constants import GPU_MEMORY_ALL_TYPES

    tags = getattr(recv_req, "tags", None)
    return list(tags) if tags else list(GPU_MEMORY_ALL_TYPES)


def _mem() -> dict:
    import torch

    free, total = torch.cuda.mem_get_info()
    return {"used_gib": round((total - free) / 2**30, 3), "free_gib": round(free / 2**30, 3)}


def _host_stats() -> dict:
    import torch

    try:
        s = torch.cuda.host_memory_stats()
        keys = ("allocations.current", "segment.current", "reserved_bytes.current",
                "allocated_bytes.current", "active_bytes.current", "num_host_alloc",
                "num_host_free")  # fmt: skip
        return {k: s[k] for k in keys if k in s} or {"keys": sorted(s)[:20]}
    except Exception as exc:  # not in every torch
        return {"error": f"{type(exc).__name__}: {exc}"}


# -- which device pointers are mapped ---------------------------------------------------------


def _ptr_status(ptr: int) -> str:
    from cuda.bindings import driver as cu

    err, _ = cu.cuPointerGetAttribute(
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_POINTER, ptr
    )
    return "ok" if err == cu.CUresult.CUDA_SUCCESS else getattr(err, "name", str(err))


def _named_ptrs(wu) -> dict[str, int]:
    out: dict[str, int] = {}
    runner = wu.tp_worker.model_runner
    sched = wu.scheduler
    with _suppress():
        out["req_to_token"] = sched.req_to_token_pool.req_to_token.data_ptr()
    with _suppress():
        kv = runner.token_to_kv_pool
        first = getattr(kv, "start_layer", 0) or 0
        out["kv_key_first_layer"] = kv.get_key_buffer(first).data_ptr()
        out["kv_value_first_layer"] = kv.get_value_buffer(first).data_ptr()
    with _suppress():
        params = list(runner.model.named_parameters())
        out["param_first:" + params[0][0]] = params[0][1].data_ptr()
        out["param_last:" + params[-1][0]] = params[-1][1].data_ptr()
    with _suppress():
        bufs = list(runner.model.named_buffers())
        if bufs:
            out["buffer_first:" + bufs[0][0]] = bufs[0][1].data_ptr()
    return out


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is not None:
            _STATE.setdefault("diag_errors", []).append(f"{et.__name__}: {ev}")
        return True


def _mapping_report(wu) -> dict:
    import torch

    report: dict = {}
    named = _named_ptrs(wu)
    report["named"] = {k: {"ptr": hex(v), "status": _ptr_status(v)} for k, v in named.items()}
    segs = torch.cuda.memory_snapshot()
    pools: dict[str, dict] = {}
    unmapped = []
    owner = {}
    for seg in segs:
        addr, size = seg["address"], seg["total_size"]
        pool = str(seg.get("segment_pool_id"))
        st = _ptr_status(addr)
        p = pools.setdefault(pool, {"n": 0, "bytes": 0, "unmapped_n": 0, "unmapped_bytes": 0})
        p["n"] += 1
        p["bytes"] += size
        if st != "ok":
            p["unmapped_n"] += 1
            p["unmapped_bytes"] += size
            if len(unmapped) < 6:
                unmapped.append({"addr": hex(addr), "size": size, "pool": pool, "status": st})
        for k, v in named.items():
            if addr <= v < addr + size:
                owner[k] = {"pool": pool, "segment": hex(addr), "segment_status": st}
    report["pools"] = pools
    report["unmapped_examples"] = unmapped
    report["owners"] = owner
    if _STATE.get("diag_errors"):
        report["diag_errors"] = _STATE.pop("diag_errors")
    return report


# -- weights: a host copy, refilled after resume ----------------------------------------------


def _weights_file() -> Path:
    return PROBE_DIR / f"weights-{os.getpid()}.pt"


def _save_weights(model) -> dict:
    import torch

    path = _weights_file()
    if path.exists():
        return {"saved": "exists", "path": str(path)}
    t = time.perf_counter()
    with torch.no_grad():
        sd = {n: p.detach().to("cpu").contiguous() for n, p in model.named_parameters()}
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    tmp = path.with_suffix(".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(sd, tmp)
    os.replace(tmp, path)
    del sd
    return {"saved": "new", "bytes": nbytes, "s": time.perf_counter() - t}


def _refill(model) -> dict:
    import torch

    path = _weights_file()
    if not path.exists():
        return {"error": f"no host copy at {path}"}
    t0 = time.perf_counter()
    sd = torch.load(path, mmap=True, weights_only=True)
    t1 = time.perf_counter()
    params = dict(model.named_parameters())
    first = next(iter(params))
    absmax_before = float(params[first].detach().float().abs().max())
    nbytes = 0
    with torch.no_grad():
        for n, p in params.items():
            p.data.copy_(sd[n])
            nbytes += p.numel() * p.element_size()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    last = list(params)[-1]
    equal = all(torch.equal(params[n].detach().cpu(), sd[n]) for n in (first, last))
    return {
        "bytes": nbytes,
        "load_s": t1 - t0,
        "copy_s": t2 - t1,
        "gib_per_s": nbytes / 2**30 / max(t2 - t1, 1e-9),
        "first_param_absmax_before_refill": absmax_before,
        "spot_check_equal": equal,
    }


# -- hooks ------------------------------------------------------------------------------------


def _around_release(original, self, recv_req, *args, **kwargs):
    import torch

    ctl = _control()
    tags = _tags(recv_req)
    if ctl.get("quiet"):  # no probe CUDA calls at all, unless asked for
        t = time.perf_counter()
        out = original(self, recv_req, *args, **kwargs)
        info = {"tags": tags, "control": ctl, "release_s": time.perf_counter() - t}
        if ctl.get("host_empty_cache"):
            t = time.perf_counter()
            torch.cuda.synchronize()
            torch._C._host_emptyCache()
            info["host_empty_cache_s"] = time.perf_counter() - t
        _log("release", **info)
        return out
    info: dict = {"tags": tags, "control": ctl, "mem_before": _mem(), "landed": hooks_landed()}
    if ctl.get("save_weights") and "weights" in tags:
        try:
            info["save_weights"] = _save_weights(self.tp_worker.model_runner.model)
        except Exception as exc:
            info["save_weights"] = {"error": f"{type(exc).__name__}: {exc}"}
    t = time.perf_counter()
    out = original(self, recv_req, *args, **kwargs)
    info["release_s"] = time.perf_counter() - t
    info["mem_after_release"] = _mem()
    info["host_stats_before"] = _host_stats()
    torch.cuda.synchronize()
    if ctl.get("host_empty_cache"):
        t = time.perf_counter()
        torch._C._host_emptyCache()
        info["host_empty_cache_s"] = time.perf_counter() - t
        info["host_stats_after"] = _host_stats()
    if ctl.get("device_empty_cache"):
        torch.cuda.empty_cache()
    if ctl.get("diag", True):
        try:
            info["map"] = _mapping_report(self)
        except Exception as exc:
            info["map"] = {"error": f"{type(exc).__name__}: {exc}"}
    info["mem_final"] = _mem()
    _log("release", **info)
    return out


def _around_resume(original, self, recv_req, *args, **kwargs):
    import torch

    ctl = _control()
    tags = _tags(recv_req)
    _STATE["no_pin"] = bool(ctl.get("no_pin"))
    if ctl.get("quiet"):  # no probe CUDA calls at all, unless asked for
        t = time.perf_counter()
        out = original(self, recv_req, *args, **kwargs)
        info = {"tags": tags, "control": ctl, "resume_s": time.perf_counter() - t}
        if ctl.get("sync_after_resume"):
            t = time.perf_counter()
            torch.cuda.synchronize()
            info["sync_s"] = time.perf_counter() - t
        _log("resume", **info)
        return out
    info: dict = {"tags": tags, "control": ctl, "mem_before": _mem()}
    t = time.perf_counter()
    out = original(self, recv_req, *args, **kwargs)
    torch.cuda.synchronize()
    info["resume_s"] = time.perf_counter() - t
    info["mem_after_resume"] = _mem()
    if ctl.get("diag", True):
        try:
            info["map"] = _mapping_report(self)
        except Exception as exc:
            info["map"] = {"error": f"{type(exc).__name__}: {exc}"}
    if ctl.get("refill") and "weights" in tags:
        try:
            info["refill"] = _refill(self.tp_worker.model_runner.model)
        except Exception as exc:
            info["refill"] = {"error": f"{type(exc).__name__}: {exc}"}
    _log("resume", **info)
    return out


def _around_tms(name):
    def hook(original, self, tag, *args, **kwargs):
        t = time.perf_counter()
        out = original(self, tag, *args, **kwargs)
        dt = time.perf_counter() - t
        _log(f"tms_{name}", tag=tag, s=dt, **({} if _control().get("quiet") else {"mem": _mem()}))
        return out

    return hook


def _around_write_cache_indices(original, *args, **kwargs):
    try:
        return original(*args, **kwargs)
    except Exception as exc:
        info: dict = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            pool = kwargs.get("req_to_token_pool", args[-1] if args else None)
            rt = pool.req_to_token
            info["req_to_token"] = {"ptr": hex(rt.data_ptr()), "status": _ptr_status(rt.data_ptr())}
            info["args"] = [
                {"i": i, "ptr": hex(a.data_ptr()), "device": str(a.device),
                 "status": _ptr_status(a.data_ptr()) if a.is_cuda else "host"}
                for i, a in enumerate(args) if hasattr(a, "data_ptr") and a.numel()
            ]  # fmt: skip
            info["mem"] = _mem()
        except Exception as exc2:
            info["diag_error"] = f"{type(exc2).__name__}: {exc2}"
        _log("write_cache_indices_failed", **info)
        raise


def _around_pin(original, *args, **kwargs):
    if _STATE["no_pin"]:
        return False
    return original(*args, **kwargs)


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    faulthandler.enable(all_threads=True)
    targets = [
        (f"{WU}.release_memory_occupation", _around_release),
        (f"{WU}.resume_memory_occupation", _around_resume),
        ("sglang.srt.mem_cache.allocation.write_cache_indices", _around_write_cache_indices),
        ("sglang.srt.utils.common.is_pin_memory_available", _around_pin),
        (
            "sglang.srt.utils.torch_memory_saver_adapter._TorchMemorySaverAdapterReal.pause",
            _around_tms("pause"),
        ),
        (
            "sglang.srt.utils.torch_memory_saver_adapter._TorchMemorySaverAdapterReal.resume",
            _around_tms("resume"),
        ),
    ]
    for target, fn in targets:
        HookRegistry.register(target, fn, HookType.AROUND)
        _STATE["hooks"].append(target)
    _log("registered", hooks=_STATE["hooks"], argv=sys.argv[:3])


def hooks_landed() -> dict[str, bool]:
    """Which bindings the scheduler really calls now hold a hook wrapper (__wrapped__)."""
    import importlib

    out = {}
    for mod, attr in (
        ("sglang.srt.managers.schedule_batch", "is_pin_memory_available"),
        ("sglang.srt.mem_cache.allocation", "write_cache_indices"),
        (
            "sglang.srt.managers.scheduler_components.weight_updater",
            "SchedulerWeightUpdaterManager",
        ),
        ("sglang.srt.utils.torch_memory_saver_adapter", "_TorchMemorySaverAdapterReal"),
    ):
        try:
            obj = getattr(importlib.import_module(mod), attr)
            if isinstance(obj, type):
                names = ("release_memory_occupation", "resume_memory_occupation", "pause", "resume")
                out[f"{mod}.{attr}"] = {
                    n: hasattr(getattr(obj, n), "__wrapped__") for n in names if hasattr(obj, n)
                }
            else:
                out[f"{mod}.{attr}"] = hasattr(obj, "__wrapped__")
        except Exception as exc:
            out[f"{mod}.{attr}"] = f"{type(exc).__name__}: {exc}"
    return out
