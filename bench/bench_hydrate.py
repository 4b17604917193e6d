"""Native hydration vs a plain memcpy and vs safetensors, side by side in one run.

A model-shaped payload (bf16 layers, a tied embedding, small fp32 norms; 2 GiB by default) is
exported as a native pack and as a safetensors file, both in the page cache. Each repetition
then fills the same, already-touched destination tensors five ways, interleaved:

  memcpy              ctypes.memmove from an in-memory copy of the payload (one thread)
  torch copy_         Tensor.copy_ from the same in-memory copy (torch may use several threads)
  native, verified    coldsnap hydrate_pack, checksums checked first (the default)
  native, one pass    hydrate_pack(one_pass=True): every block checked as it lands
  native, preverified coldsnap hydrate_pack with COLDSNAP_ARTIFACT_PREVERIFIED semantics
  safetensors         safetensors.torch.load_file + copy_ into the destination

and prints the median time, GiB/s, the ratio to the baseline's speed (memcpy on CPU) and to
safetensors' (the best unverified alternative). Goals: native >= 0.8 of memcpy;
native with verification >= 1.0 of safetensors (docs/performance.md). Load average
before and after.

    .venv/bin/python bench/bench_hydrate.py [--gib 2] [--reps 5] [--threads N] [--dir DIR]
        [--device cuda]   # GPU destination; the baseline is then a pinned host-to-device copy
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from coldsnap.providers import Hydrator, PackDirectory, export_pack

GIB = 1 << 30


def payload(gib: float) -> dict[str, torch.Tensor]:
    """Layers of 48 MiB (qkv) + 32 MiB (o) in bf16 with fp32 norms, and a tied embedding."""
    hidden = 4096
    tensors: dict[str, torch.Tensor] = {}
    emb = torch.empty(6144, hidden, dtype=torch.bfloat16)
    tensors["model.embed_tokens.weight"] = emb
    tensors["lm_head.weight"] = emb
    layer_bytes = (6144 + 4096) * hidden * 2
    layers = max(1, round((gib * GIB - emb.numel() * 2) / layer_bytes))
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.qkv_proj.weight"] = torch.empty(6144, hidden, dtype=torch.bfloat16)
        tensors[p + "self_attn.o_proj.weight"] = torch.empty(hidden, hidden, dtype=torch.bfloat16)
        tensors[p + "input_layernorm.weight"] = torch.empty(hidden, dtype=torch.float32)
        tensors[p + "post_attention_layernorm.weight"] = torch.empty(hidden, dtype=torch.float32)
    return tensors


def unique(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    seen: set[int] = set()
    out = {}
    for name, t in tensors.items():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out[name] = t
    return out


def fill_random(tensors: dict[str, torch.Tensor], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for t in unique(tensors).values():
        t.view(torch.uint8).view(-1).copy_(
            torch.randint(0, 256, (t.numel() * t.element_size(),), generator=g, dtype=torch.uint8)
        )


def _load(averages: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in averages)


def warm(path: Path) -> None:
    """Reads a file once so its pages are in the page cache."""
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(64 << 20)
        while handle.readinto(buffer):
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (a disk)")
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the destination lives; on cuda the baseline is a pinned host-to-device copy",
    )
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")

    scratch = Path(tempfile.mkdtemp(prefix="coldsnap-bench-", dir=args.dir))
    try:
        src = payload(args.gib)
        fill_random(src, 1)
        dst = payload(args.gib)
        fill_random(dst, 2)  # touched pages, like weights that are already mapped
        if cuda:
            moved = {id(t): t.to(args.device) for t in unique(dst).values()}
            dst = {name: moved[id(t)] for name, t in dst.items()}
        nbytes = sum(t.untyped_storage().nbytes() for t in unique(src).values())

        t0 = time.perf_counter()
        export_pack(src, scratch / "pack")
        export_s = time.perf_counter() - t0
        save_file(unique(src), str(scratch / "model.safetensors"))
        for path in [*(scratch / "pack").glob("*.pack"), scratch / "model.safetensors"]:
            warm(path)
        source = PackDirectory(scratch / "pack")
        pairs = [(unique(dst)[n], unique(src)[n]) for n in unique(src)]
        probe = min(pairs, key=lambda pair: pair[1].numel())  # reset before, checked after
        pinned = [(d, s.pin_memory()) for d, s in pairs] if cuda else []

        hydrator = Hydrator(threads=args.threads)

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize()

        def memcpy() -> None:
            if cuda:
                for d, s in pinned:
                    d.copy_(s, non_blocking=True)
                return
            for d, s in pairs:
                ctypes.memmove(d.data_ptr(), s.data_ptr(), s.untyped_storage().nbytes())

        def torch_copy() -> None:
            with torch.no_grad():
                for d, s in pairs:
                    d.copy_(s)

        def native_verified() -> None:
            hydrator.hydrate(dst, source, verify=True)

        def native_one_pass() -> None:
            hydrator.hydrate(dst, source, verify=True, one_pass=True)

        def native_preverified() -> None:
            hydrator.hydrate(dst, source, verify=False)

        def safetensors_copy() -> None:
            loaded = load_file(str(scratch / "model.safetensors"))
            with torch.no_grad():
                for name, t in loaded.items():
                    unique(dst)[name].copy_(t)
            del loaded

        baseline = "pinned host-to-device copy_" if cuda else "memcpy (1 thread)"
        methods: dict[str, Callable[[], None]] = {
            baseline: memcpy,
            "torch copy_ (in memory)": torch_copy,
            "native, verified": native_verified,
            "native, verified in one pass": native_one_pass,
            "native, preverified": native_preverified,
            "safetensors load_file + copy_": safetensors_copy,
        }
        times: dict[str, list[float]] = {name: [] for name in methods}
        load_before = os.getloadavg()
        for _ in range(args.reps):
            for name, fn in methods.items():
                probe[0].zero_()
                sync()
                start = time.perf_counter()
                fn()
                sync()
                times[name].append(time.perf_counter() - start)
                assert torch.equal(probe[0].cpu().view(torch.uint8), probe[1].view(torch.uint8))
        ok = all(torch.equal(d.cpu().view(torch.uint8), s.view(torch.uint8)) for d, s in pairs)
        hydrator.close()

        load_after = os.getloadavg()
        base = statistics.median(times[baseline])
        rival = statistics.median(times["safetensors load_file + copy_"])
        print(
            f"payload {nbytes / GIB:.2f} GiB in {len(pairs)} storages, {args.reps} reps, "
            f"threads={hydrator.threads}, cpus={os.cpu_count()}, torch {torch.__version__}, "
            f"destination {args.device}, "
            f"export {export_s:.2f} s ({nbytes / GIB / export_s:.2f} GiB/s), load average "
            f"{_load(load_before)} before, {_load(load_after)} after"
        )
        print(
            f"{'method':32s} {'median s':>9s} {'GiB/s':>7s} {'vs base':>9s} {'vs st':>7s}"
            "  all runs (s)"
        )
        results = {}
        for name, samples in times.items():
            median = statistics.median(samples)
            results[name] = {
                "median_s": median,
                "gib_s": nbytes / GIB / median,
                "runs_s": samples,
                "vs_base": base / median,
                "vs_safetensors": rival / median,
            }
            runs = " ".join(f"{s:.3f}" for s in samples)
            print(
                f"{name:32s} {median:9.3f} {nbytes / GIB / median:7.2f} "
                f"{base / median:9.2f} {rival / median:7.2f}  {runs}"
            )
        print(f"destination bytes equal the payload: {ok}")
        if args.json:
            record = {"nbytes": nbytes, "reps": args.reps, "results": results}
            record["load"] = {"before": load_before, "after": load_after}
            print(json.dumps(record))
        return 0 if ok else 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
