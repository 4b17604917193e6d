"""P3: native hydration GiB/s against a pinned host-to-device copy of the same bytes.

One pack (page-cached, as after export or staging) is hydrated into a fresh set of CUDA storages
with the pack's own layout, every way the provider can, interleaved and repeated; the
destination is poisoned before every run and compared with the pack once per method.

  pinned H2D         the reference: a 1 GiB pinned buffer (allocated once) copied to the GPU
                     until as many bytes as the pack holds have moved
  ring               coldsnap's Hydrator (reader threads, pinned ring), verify on / off
  registered         fastpath: mapping registered window by window while the copies run,
                     block checksums verified on CPU threads during the copy, on / off
  registered, pre    registration done first (as in a restore's preparation), then the copy
  register only      cudaHostRegister of the whole pack with 1..16 threads (and unregister)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastpath
import torch

from coldsnap.providers import Hydrator, PackDirectory
from coldsnap.providers._layout import DTYPES

GIB = 1 << 30


def destination(source: PackDirectory) -> dict[str, torch.Tensor]:
    """CUDA storages with exactly the pack's layout (sizes, views, aliases)."""
    out: dict[str, torch.Tensor] = {}
    for extent in source.index.extents:
        storage = torch.empty(extent.nbytes, dtype=torch.uint8, device="cuda").untyped_storage()
        for v in extent.views:
            t = torch.empty(0, dtype=DTYPES[v.dtype], device="cuda")
            out[v.name] = t.set_(storage, v.storage_offset, v.shape, v.stride)
    return out


def storages(mapping: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for t in mapping.values():
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            flat = torch.empty(0, dtype=torch.uint8, device="cuda")
            seen[s.data_ptr()] = flat.set_(s, 0, (s.nbytes(),), (1,))
    return list(seen.values())


def poison(flats: list[torch.Tensor]) -> None:
    for f in flats:
        f.fill_(0xA5)
    torch.cuda.synchronize()


def matches_pack(source: PackDirectory, mapping: dict[str, torch.Tensor]) -> bool:
    """The bytes on the GPU equal the pack's bytes (compared on the GPU) for the first, the
    last and the largest extent (all of them would take longer than the runs themselves)."""
    by_name = {n: t for n, t in mapping.items()}
    extents = source.index.extents
    chosen = {0, len(extents) - 1, max(range(len(extents)), key=lambda i: extents[i].nbytes)}
    for extent in (extents[i] for i in sorted(chosen)):
        t = by_name[extent.views[0].name]
        s = t.untyped_storage()
        gpu = torch.empty(0, dtype=torch.uint8, device="cuda").set_(s, 0, (s.nbytes(),), (1,))
        path = source.pack_path(extent.pack)
        with open(path, "rb") as f:
            f.seek(extent.offset)
            host = torch.frombuffer(bytearray(f.read(extent.nbytes)), dtype=torch.uint8)
        if not torch.equal(gpu, host.to("cuda")):
            return False
    return True


def measure(pack_dir: Path, *, reps: int, log: Callable[..., None]) -> dict[str, Any]:
    source = PackDirectory(pack_dir)
    nbytes = source.index.nbytes
    fastpath.touch_page_cache([str(source.pack_path(p.digest)) for p in source.index.packs])
    log(f"P3: pack {pack_dir}, {nbytes / GIB:.2f} GiB in {len(source.index.extents)} extents")
    mapping = destination(source)
    flats = storages(mapping)
    results: dict[str, Any] = {"nbytes": nbytes, "runs": {}, "bytes_match": {}}
    runs: dict[str, list[float]] = results["runs"]

    def record(name: str, gib_s: float, detail: Any = None) -> None:
        runs.setdefault(name, []).append(gib_s)
        log(f"P3 {name}: {gib_s:.2f} GiB/s", detail or "")

    ring = Hydrator(threads=16)
    methods: dict[str, Callable[[], tuple[float, Any]]] = {}

    def ring_run(verify: bool) -> tuple[float, Any]:
        r = ring.hydrate(mapping, source, verify=verify)
        return r.gib_per_s, {"verify_s": r.verify_seconds, "copy_s": r.copy_seconds}

    def registered_run(verify: bool, threads: int) -> tuple[float, Any]:
        r = fastpath.hydrate_registered(
            mapping, source, verify=verify, register_threads=threads, verify_threads=8
        )
        return r.gib_per_s, {
            "seconds": r.seconds,
            "register_s": r.register_seconds,
            "copy_wait_s": r.copy_wait_seconds,
            "verify_s": r.verify_seconds,
            "unregister_s": r.unregister_seconds,
        }

    def preregistered_run(verify: bool, verify_threads: int = 8) -> tuple[float, Any]:
        with fastpath.RegisteredPacks(
            source, register_threads=8, verify_threads=verify_threads
        ) as packs:
            reg = packs.register_all()
            r = packs.copy(mapping, verify=verify, unregister=False)
            unreg = packs.unregister_all()
        return r.gib_per_s, {"register_first_s": reg, "copy_s": r.seconds, "unregister_s": unreg}

    methods["ring verify=off"] = lambda: ring_run(False)
    methods["ring verify=on"] = lambda: ring_run(True)
    for threads in (1, 4, 8):
        methods[f"registered t{threads} verify=off"] = lambda t=threads: registered_run(False, t)
    methods["registered t4 verify=on"] = lambda: registered_run(True, 4)
    methods["registered t8 verify=on"] = lambda: registered_run(True, 8)
    methods["registered pre verify=off"] = lambda: preregistered_run(False)
    methods["registered pre verify=on"] = lambda: preregistered_run(True)
    methods["registered pre verify=on v16"] = lambda: preregistered_run(True, 16)

    for rep in range(reps):
        for gib_s in fastpath.pinned_h2d_gib_per_s(nbytes, reps=1):
            record("pinned H2D", gib_s)
        for name, fn in methods.items():
            poison(flats)
            try:
                gib_s, detail = fn()
            except Exception as exc:  # one method failing must not hide the others
                results.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
                log(f"P3 {name}: FAILED {type(exc).__name__}: {exc}")
                continue
            torch.cuda.synchronize()
            if rep == 0:
                results["bytes_match"][name] = matches_pack(source, mapping)
            record(name, gib_s, detail)
    for threads in (1, 4, 8, 16):
        with fastpath.RegisteredPacks(source, register_threads=threads) as packs:
            t = packs.register_all()
            u = packs.unregister_all()
        results.setdefault("register_only", {})[f"t{threads}"] = {
            "register_gib_s": nbytes / GIB / t,
            "unregister_gib_s": nbytes / GIB / u,
        }
        log(
            f"P3 register only t{threads}: {nbytes / GIB / t:.1f} GiB/s, unregister "
            f"{nbytes / GIB / u:.1f} GiB/s"
        )
    ring.close()
    pinned = statistics.median(runs["pinned H2D"])
    summary = {"pinned H2D": f"{pinned:.2f} GiB/s (median of {len(runs['pinned H2D'])})"}
    for name, values in runs.items():
        if name == "pinned H2D":
            continue
        med = statistics.median(values)
        summary[name] = f"{med:.2f} GiB/s = {med / pinned:.3f} of pinned (median of {len(values)})"
    results["summary"] = summary
    results["seconds_measured_at"] = time.strftime("%H:%M:%S")
    mapping.clear()
    flats.clear()
    torch.cuda.empty_cache()
    return results
