"""In-engine probe for bench/gpu/arch_probe.py (bench only, never the product).

Python runs this module at start in every process whose path holds this folder; it does
nothing unless ARCH_PROBE_DIR is set. Then, in each process:

- every replacement of a rotary embedding's `cos_sin_cache` buffer is traced (old and new dtype
  and address, whether a CUDA graph was being captured, the call stack), and so is every model
  registration by coldsnap's plugin (with the dtype and address of each rotary cache at that
  moment): one JSON line each in ARCH_PROBE_DIR/trace-<pid>.jsonl. Together they say whether a
  buffer changed after the plugin recorded it, and which call changed it;
- a daemon thread answers probe requests: for each file ARCH_PROBE_DIR/req-<tag> it has not seen
  (holding the engine's COLDSNAP_RUNTIME_DIR, so that one engine of several answers), a process
  whose coldsnap registry holds a model writes ARCH_PROBE_DIR/ans-<tag>-<pid>.json with,
  per tensor of each registered model (parameters and buffers under every name, non-persistent
  buffers too), dtype, shape, storage address, a blake2b of its bytes and a few statistics, plus
  the registry's own live check. The harness asks only while the engine is idle.

Both patches go in through an import hook, so SGLang and coldsnap are unchanged on disk.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

_DIR = os.environ.get("ARCH_PROBE_DIR")
_TRACE_STACKS = 4  # stacks for the first few replacements of a process; later ones are counted
_state: dict[str, Any] = {"recasts": 0, "same_tensor_sets": 0}
_lock = threading.Lock()


def _trace(kind: str, **fields: Any) -> None:
    assert _DIR is not None
    line = json.dumps({"kind": kind, "pid": os.getpid(), "t": time.time(), **fields}, default=str)
    with _lock, open(Path(_DIR) / f"trace-{os.getpid()}.jsonl", "a") as f:
        f.write(line + "\n")


def _describe(t: Any) -> dict[str, Any] | None:
    if t is None:
        return None
    return {
        "dtype": str(t.dtype),
        "device": str(t.device),
        "shape": list(t.shape),
        "ptr": t.untyped_storage().data_ptr(),
    }


def _capturing() -> bool | None:
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:  # a probe must never break the engine it watches
        return None


def _patch_rotary(module: Any) -> None:
    """Traces assignments of `cos_sin_cache` on every rotary embedding class."""
    cls = module.RotaryEmbedding
    base = cls.__setattr__

    def traced(self: Any, name: str, value: Any) -> None:
        if name == "cos_sin_cache":
            old = self.__dict__.get("_buffers", {}).get("cos_sin_cache")
            if old is not None and value is old:
                _state["same_tensor_sets"] += 1  # `.to()` of a cache already cast: no change
            elif old is not None:
                _state["recasts"] += 1
                n = _state["recasts"]
                _trace(
                    "cos_sin_cache_set",
                    n=n,
                    cls=type(self).__name__,
                    head_size=getattr(self, "head_size", None),
                    use_fallback_kernel=getattr(self, "use_fallback_kernel", None),
                    bf16_rope_store=getattr(self, "_supports_bf16_rope_store", None),
                    old=_describe(old),
                    new=_describe(value),
                    capturing=_capturing(),
                    thread=threading.current_thread().name,
                    stack=traceback.format_stack(limit=40)[:-1] if n <= _TRACE_STACKS else None,
                )
        base(self, name, value)

    cls.__setattr__ = traced
    _trace("patched", module=module.__name__)


def _patch_registry(module: Any) -> None:
    """Traces each registration with the rotary caches' state at that moment."""
    cls = module.StorageRegistry
    register = cls.register

    def traced(self: Any, role: str, model: Any) -> Any:
        entry = register(self, role, model)
        caches = {r.name: [r.dtype, r.storage_ptr] for r in entry.records if "cos_sin" in r.name}
        _trace(
            "registered",
            role=role,
            tensors=len(entry.records),
            rotary=dict(list(caches.items())[:4]),
            rotary_count=len(caches),
            stack=traceback.format_stack(limit=14)[:-1],
        )
        return entry

    cls.register = traced
    _trace("patched", module=module.__name__)


_PATCHES = {
    "sglang.srt.layers.rotary_embedding.base": _patch_rotary,
    "coldsnap.plugin._storages": _patch_registry,
}


class _PatchFinder(importlib.abc.MetaPathFinder):
    """Finds the patched modules the normal way, then patches them right after they run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            try:
                patch(module)
            except Exception:
                _trace("patch_failed", module=name, error=traceback.format_exc())

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


# -- the probe thread ----------------------------------------------------------------------------


def _stats(t: Any) -> dict[str, Any]:
    import torch

    x = t.detach().reshape(-1)
    if x.numel() == 0:
        return {"numel": 0}
    if x.dtype.is_floating_point:
        f = x.float()
        return {
            "numel": x.numel(),
            "sum": float(f.sum()),
            "abs_sum": float(f.abs().sum()),
            "zeros": int((f == 0).sum()),
            "nan": int(torch.isnan(f).sum()),
            "head": [float(v) for v in f[:4]],
        }
    return {"numel": x.numel(), "head": [int(v) for v in x[:4]]}


def _tensor_table(model: Any) -> dict[str, Any]:
    """name -> description of every parameter and buffer (all names), hashed on the host."""
    import torch

    named: dict[str, Any] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        named[name] = ("parameter", p)
    for name, b in model.named_buffers(remove_duplicate=False):
        if b is not None:
            named[name] = ("buffer", b)
    hosts: dict[tuple[str, int], Any] = {}  # storage -> its bytes on the host, each copied once
    out: dict[str, Any] = {}
    for name in sorted(named):
        kind, t = named[name]
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if key not in hosts:
            flat = torch.empty(0, dtype=torch.uint8, device=t.device)
            flat.set_(storage, 0, (storage.nbytes(),), (1,))
            hosts[key] = flat.cpu()  # a host allocation only: no device memory is taken
        host = torch.empty(0, dtype=t.dtype)
        host.set_(hosts[key].untyped_storage(), t.storage_offset(), t.shape, t.stride())
        data = host.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        out[name] = {
            "kind": kind,
            "dtype": str(t.dtype),
            "shape": list(t.shape),
            "storage_ptr": storage.data_ptr(),
            "data_ptr": t.data_ptr(),
            "hash": hashlib.blake2b(data, digest_size=12).hexdigest(),
            **_stats(host),
        }
    return out


def _answer(tag: str, runtime_dir: str) -> None:
    if runtime_dir and os.environ.get("COLDSNAP_RUNTIME_DIR") != runtime_dir:
        return  # asked of another engine
    registry_module = sys.modules.get("coldsnap.plugin._storages")
    if registry_module is None or not registry_module.REGISTRY.models():
        return
    t0 = time.perf_counter()
    models = {}
    for entry in registry_module.REGISTRY.models():
        try:
            entry.check_live()
            live = "ok"
        except Exception as exc:
            live = f"{type(exc).__name__}: {exc}"
        registered = {
            r.name: {"dtype": r.dtype, "storage_ptr": r.storage_ptr, "kind": r.kind}
            for r in entry.records
        }
        models[entry.role] = {
            "check_live": live,
            "registered": registered,
            "tensors": _tensor_table(entry.model),
        }
    record = {
        "tag": tag,
        "pid": os.getpid(),
        "seconds": round(time.perf_counter() - t0, 3),
        "recasts": _state["recasts"],
        "same_tensor_sets": _state["same_tensor_sets"],
        "models": models,
    }
    assert _DIR is not None
    tmp = Path(_DIR) / f".ans-{tag}-{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, default=str))
    tmp.replace(Path(_DIR) / f"ans-{tag}-{os.getpid()}.json")


def _serve() -> None:
    seen: set[str] = set()
    while True:
        time.sleep(0.2)
        try:
            names = os.listdir(_DIR)  # type: ignore[arg-type]
        except OSError:
            continue
        for name in names:
            if not name.startswith("req-") or name in seen:
                continue
            seen.add(name)
            try:
                runtime_dir = (Path(_DIR) / name).read_text().strip()  # type: ignore[arg-type]
                _answer(name.removeprefix("req-"), runtime_dir)
            except Exception:
                _trace("probe_failed", tag=name, error=traceback.format_exc())


if _DIR:
    sys.meta_path.insert(0, _PatchFinder())
    threading.Thread(target=_serve, name="arch-probe", daemon=True).start()
