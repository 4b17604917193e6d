"""Prefill: the payload on the GPU before the restored engine asks for it.

A restore's refill from host memory is on its critical path (8 GiB at the pinned bus speed is
0.17 s; registering the pack's pages for the GPU costs as much again, and it has to be done by
the process that copies). So while CRIU restores the engine's process tree, one helper process
per rank (`python -m coldsnap.providers.native._prefill`) maps the verified pack files, page-locks
them window by window, copies them into device memory of its own on the rank's GPU, and
publishes CUDA IPC handles of that memory (`ready.json`, a `PrefillRecord`). When the restored
engine resumes its weights, the plugin opens the handles and copies device to device into the
final storages (`fill_from_prefill`: milliseconds), then writes `consumed`; the helper frees its
memory and exits. Device memory: the helper holds one copy of the rank's payload from the start
of the restore until the weights are filled, before the engine maps its KV cache again.

The helper ends on its own when the engine consumed its memory, when its `timeout` passes, or
when its parent (the orchestrator) dies. It reads only packs the orchestrator verified before it
started it; it records each file's identity (device, inode, size, modification time) before its
copy and checks it after: a pack changed on the way is reported as a failure, never served.
Anything the helper cannot do is written to `failed.json` with the reason; the plugin then
refills from the pack itself and says so (`cuda_path` "ring"/"registered" with `prefill` giving
the reason), so a prefill failure costs time, not correctness.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen
from attrs.validators import instance_of

from coldsnap._atomic import write_bytes_atomic

from .._convert import dumps, loads
from .._errors import HydrationFailed
from .._layout import Tensors, as_mapping
from ._plan import plan
from ._source import PackDirectory, PackSource

READY = "ready.json"
FAILED = "failed.json"
CONSUMED = "consumed"  # written by the engine once it copied the helper's memory
RELEASE = "release"  # written by the orchestrator: the helper's memory is no longer wanted
FORMAT = 1
KIND = "coldsnap.prefill"
_MEMCPY_HOST_TO_DEVICE, _MEMCPY_DEVICE_TO_DEVICE = 1, 3
_IPC_LAZY_ENABLE_PEER_ACCESS = 1
_PR_SET_PDEATHSIG = 1


@frozen
class PrefilledPack:
    digest: str = attrs.field(validator=instance_of(str))
    size: int = attrs.field(validator=instance_of(int))
    handle: str = attrs.field(validator=instance_of(str))  # cudaIpcMemHandle_t, hex


@frozen
class PrefillRecord:
    """What one helper published for one role of one rank (`ready.json`), or why it could not
    (`failed.json`: `error` set, no packs)."""

    device: int = attrs.field(validator=instance_of(int))
    packs: tuple[PrefilledPack, ...] = ()
    seconds: float = attrs.field(default=0.0, validator=instance_of(float))
    error: str | None = None
    format: int = attrs.field(default=FORMAT, validator=instance_of(int))
    kind: str = attrs.field(default=KIND, validator=instance_of(str))

    def __attrs_post_init__(self) -> None:
        if self.format != FORMAT or self.kind != KIND:
            raise ValueError(
                f"format/kind: expected {FORMAT}/{KIND!r}, got {self.format}/{self.kind!r}"
            )


# -- the consumer: the restored engine's scheduler ----------------------------------------------


def wait_record(folder: Path, timeout: float) -> PrefillRecord:
    """The helper's record once it is written; HydrationFailed with the reason when the helper
    failed or did not finish within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        for name in (READY, FAILED):
            path = folder / name
            if path.exists():
                try:
                    record = loads(path.read_bytes(), PrefillRecord)
                except (OSError, ValueError) as exc:  # RecordError is a ValueError
                    raise HydrationFailed(f"the prefill record {path}: {exc}") from exc
                if record.error is not None:
                    raise HydrationFailed(f"the prefill of {folder} failed: {record.error}")
                return record
        if time.monotonic() > deadline:
            raise HydrationFailed(f"the prefill of {folder} was not ready after {timeout:.1f} s")
        time.sleep(0.002)


def fill_from_prefill(
    tensors: Tensors, source: PackSource, folder: Path, *, timeout: float
) -> dict[str, Any]:
    """Copies the prefilled payload into the final storages of `tensors`, device to device, and
    tells the helper it may free its memory. Raises HydrationFailed (nothing written) when the
    record is missing, failed, or does not match the pack source and the storages' device."""
    import torch

    from . import _cuda

    t0 = time.perf_counter()
    record = wait_record(folder, timeout)
    waited = time.perf_counter() - t0
    jobs = plan(source.index, as_mapping(tensors))
    by_digest = {p.digest: p for p in record.packs}
    unlike = [
        p.digest
        for p in source.index.packs
        if p.digest not in by_digest or by_digest[p.digest].size != p.size
    ]
    if unlike:
        raise HydrationFailed(f"the prefill of {folder} lacks pack(s) {', '.join(unlike)}")
    devices = {job.group.device for job in jobs}
    if any(d.type != "cuda" or d.index != record.device for d in devices):
        raise HydrationFailed(f"the prefill is on cuda:{record.device}; storages on {devices}")
    lib = _cuda.cudart()
    opened: dict[str, int] = {}
    stream = torch.cuda.Stream(device=torch.device("cuda", record.device))
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    start = time.perf_counter()
    try:
        for digest in {job.extent.pack for job in jobs}:
            handle = _cuda.IpcHandle.from_buffer_copy(bytes.fromhex(by_digest[digest].handle))
            pointer = ctypes.c_void_p()
            _cuda.check(lib.cudaIpcOpenMemHandle(
                ctypes.byref(pointer), handle, _IPC_LAZY_ENABLE_PEER_ACCESS
            ), f"cudaIpcOpenMemHandle of pack {digest}", HydrationFailed)  # fmt: skip
            opened[digest] = int(pointer.value or 0)
        for job in jobs:
            source_address = opened[job.extent.pack] + job.extent.offset
            _cuda.check(lib.cudaMemcpyAsync(
                ctypes.c_void_p(job.group.data_ptr()), ctypes.c_void_p(source_address),
                ctypes.c_size_t(job.extent.nbytes), _MEMCPY_DEVICE_TO_DEVICE,
                ctypes.c_void_p(stream.cuda_stream),
            ), f"device-to-device copy of {job.extent.name}", HydrationFailed)  # fmt: skip
        stream.synchronize()
    finally:
        for pointer in opened.values():
            lib.cudaIpcCloseMemHandle(ctypes.c_void_p(pointer))
        (folder / CONSUMED).touch()
    seconds = time.perf_counter() - start
    return {
        "nbytes": sum(job.extent.nbytes for job in jobs),
        "wait_seconds": round(waited, 6),
        "copy_seconds": seconds,
        "prefill_seconds": record.seconds,
    }


# -- the helper process ---------------------------------------------------------------------------


def command(roles: Mapping[str, Path], out: Path, device: int, timeout: float) -> list[str]:
    """The helper's command line: one process per rank, `roles` its pack directories."""
    argv = [sys.executable, "-m", __name__, "--out", str(out), "--device", str(device)]
    argv += ["--timeout", str(timeout)]
    for role, path in sorted(roles.items()):
        argv += ["--role", f"{role}={path}"]
    return argv


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _fill_role(
    lib: Any, source: PackDirectory, pool: ThreadPoolExecutor
) -> tuple[tuple[PrefilledPack, ...], dict[str, int]]:
    """Copies every pack of `source` into a device allocation of its own (returns them, with
    the files' identities before the copy, for the check after it)."""
    from . import _cuda

    buffers: dict[str, int] = {}
    files: dict[str, _cuda.RegisteredFile] = {}
    fds: list[int] = []
    identities = {}
    stream = ctypes.c_void_p()
    _cuda.check(lib.cudaStreamCreate(ctypes.byref(stream)), "cudaStreamCreate", HydrationFailed)
    try:
        for pack in source.index.packs:
            path = source.pack_path(pack.digest)
            identities[pack.digest] = (path, _identity(path))
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            fds.append(fd)
            files[pack.digest] = _cuda.RegisteredFile(fd, pack.size)
            pointer = ctypes.c_void_p()
            _cuda.check(lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(pack.size)),
                   f"cudaMalloc of {pack.size} bytes", HydrationFailed)  # fmt: skip
            buffers[pack.digest] = int(pointer.value or 0)
        registrations = [
            (digest, i, pool.submit(f.register, i))
            for digest, f in files.items()
            for i in range(len(f.windows))
        ]
        for digest, i, future in registrations:
            future.result()
            offset, length = files[digest].windows[i]
            _cuda.check(lib.cudaMemcpyAsync(
                ctypes.c_void_p(buffers[digest] + offset),
                ctypes.c_void_p(files[digest].address + offset),
                ctypes.c_size_t(length), _MEMCPY_HOST_TO_DEVICE, stream,
            ), f"host-to-device copy of pack {digest}", HydrationFailed)  # fmt: skip
        _cuda.check(lib.cudaStreamSynchronize(stream), "cudaStreamSynchronize", HydrationFailed)
    finally:
        for f in files.values():
            f.close()  # unregisters and unmaps
        for fd in fds:
            os.close(fd)
    changed = [str(p) for p, seen in identities.values() if _identity(p) != seen]
    if changed:
        raise HydrationFailed(
            "pack file(s) changed while they were prefilled: " + ", ".join(changed)
        )
    handles = {}
    for digest, pointer in buffers.items():
        handle = _cuda.IpcHandle()
        _cuda.check(lib.cudaIpcGetMemHandle(ctypes.byref(handle), ctypes.c_void_p(pointer)),
               f"cudaIpcGetMemHandle of pack {digest}", HydrationFailed)  # fmt: skip
        handles[digest] = bytes(handle).hex()
    packs = tuple(
        PrefilledPack(digest=p.digest, size=p.size, handle=handles[p.digest])
        for p in source.index.packs
    )
    return packs, buffers


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="coldsnap-prefill", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", type=int, required=True)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--role", action="append", default=[], help="ROLE=PACK_DIR")
    args = p.parse_args(argv)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the orchestrator gone: nothing to serve
    parent = os.getppid()
    roles = dict(r.split("=", 1) for r in args.role)
    outs = {role: args.out / role for role in roles}
    for out in outs.values():
        out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    buffers: list[int] = []
    lib = None
    try:
        import torch

        from . import _cuda

        torch.cuda.set_device(args.device)  # before anything makes a context on device 0
        lib = _cuda.cudart()
        _cuda.check(
            lib.cudaSetDevice(args.device), f"cudaSetDevice({args.device})", HydrationFailed
        )
        with ThreadPoolExecutor(
            4, initializer=lambda: lib.cudaSetDevice(args.device)
        ) as pool:  # registration threads take the rank's device first
            for role, path in sorted(roles.items()):
                packs, held = _fill_role(lib, PackDirectory(path), pool)
                buffers += held.values()
                record = PrefillRecord(
                    device=args.device, packs=packs, seconds=round(time.perf_counter() - t0, 6)
                )
                write_bytes_atomic(outs[role] / READY, dumps(record))
    except Exception as exc:
        failed = PrefillRecord(device=args.device, error=f"{type(exc).__name__}: {exc}")
        for out in outs.values():
            if not (out / READY).exists():
                write_bytes_atomic(out / FAILED, dumps(failed))
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and os.getppid() == parent:
        if (args.out / RELEASE).exists() or all(
            (out / CONSUMED).exists() or (out / FAILED).exists() for out in outs.values()
        ):
            break
        time.sleep(0.005)
    if lib is not None:
        for pointer in buffers:
            lib.cudaFree(ctypes.c_void_p(pointer))
    return 0


def rank_roles(payload_dir: Path) -> dict[int, dict[str, Path]]:
    """rank -> role -> pack directory, from the payload's `tp<rank>/<role>` layout."""
    out: dict[int, dict[str, Path]] = {}
    for rank_dir in sorted(payload_dir.glob("tp*")):
        if rank_dir.name[2:].isdigit():
            roles = {d.name: d for d in rank_dir.iterdir() if (d / "index.json").is_file()}
            if roles:
                out[int(rank_dir.name[2:])] = roles
    return out


__all__ = [
    "CONSUMED",
    "FAILED",
    "READY",
    "RELEASE",
    "PrefillRecord",
    "PrefilledPack",
    "command",
    "fill_from_prefill",
    "rank_roles",
    "wait_record",
]

if __name__ == "__main__":
    raise SystemExit(main())
