"""Collecting the runtime facts an identity binds. Works on CPU hosts (the CUDA fields are None
there) and never reads anything host-specific (hostname, addresses, UUIDs, absolute paths)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from coldsnap._cuda import device_count, device_properties, nccl_version
from coldsnap._torch import gpu_build

from ._hashing import sha256_file
from ._identity import (
    EngineBuild,
    FileDigest,
    Identity,
    ModelBinding,
    Platform,
    SnapshotDriver,
    Topology,
)

_NVIDIA_VERSION = Path("/proc/driver/nvidia/version")


def collect_platform(device: int | None = None) -> Platform:
    """The CUDA runtime, driver major, compute capability, capacity class and NCCL version of
    `device` (device 0 when None); all None without CUDA. Read without importing torch
    (coldsnap._cuda asks the driver and NCCL; torch's build is read from its version file): a
    restore's admit takes milliseconds on a CPU host and on a GPU host alike."""
    built = gpu_build()
    if built is None:
        return Platform()  # no CUDA runtime, no NCCL binding in a CPU build
    if not built.startswith("cuda "):
        return _torch_platform(device)
    cuda_runtime = built.removeprefix("cuda ")
    if device_count() == 0:
        return Platform(cuda_runtime=cuda_runtime, nccl_version=nccl_version())
    capability, total = device_properties(0 if device is None else device)
    return Platform(
        cuda_runtime=cuda_runtime,
        driver_major=_driver_major(),
        compute_capability=capability,
        capacity_gib=max(1, round(total / (1 << 30))),
        nccl_version=nccl_version(),
    )


def _torch_platform(device: int | None) -> Platform:
    """A build for another accelerator (ROCm): torch itself is asked, the slow way."""
    import torch
    import torch.cuda.nccl as nccl

    if not torch.cuda.is_available():
        return Platform(nccl_version=".".join(map(str, nccl.version())))
    index = torch.cuda.current_device() if device is None else device
    major, minor = torch.cuda.get_device_capability(index)
    total = torch.cuda.get_device_properties(index).total_memory
    return Platform(
        driver_major=_driver_major(),
        compute_capability=f"{major}.{minor}",
        capacity_gib=max(1, round(total / (1 << 30))),
        nccl_version=".".join(map(str, nccl.version())),
    )


def _driver_major() -> int | None:
    """The kernel driver's major version (580 for 580.159.04), from the driver's proc file."""
    try:
        text = _NVIDIA_VERSION.read_text()
    except OSError:
        return None
    for word in text.split():
        head = word.split(".")[0]
        if "." in word and head.isdigit() and int(head) >= 100:
            return int(head)
    return None


def file_sha256(path: str | os.PathLike[str]) -> str:
    """`sha256:<hex>` of a file, streamed (symbolic links followed: checkpoints are made of
    them)."""
    return sha256_file(path)


def checkpoint_digests(
    root: str | os.PathLike[str], patterns: Iterable[str] = ("*.safetensors", "*.json")
) -> tuple[FileDigest, ...]:
    """Digests and sizes of the checkpoint files under `root` that match `patterns`, named
    relative to it (never absolutely). Symlinks are followed: a Hugging Face cache snapshot is
    made of them, and the digest is what is trusted."""
    base = Path(root)
    found = sorted({p for pattern in patterns for p in base.rglob(pattern) if p.is_file()})
    return tuple(
        FileDigest(p.relative_to(base).as_posix(), file_sha256(p), p.stat().st_size) for p in found
    )


def tree_digest(root: str | os.PathLike[str], pattern: str = "*.py") -> str:
    """A digest of the relative names and contents of the matching files under `root` (the
    plugin's source digest): the same for two installs of the same sources at any path."""
    base = Path(root)
    digest = hashlib.sha256()
    for path in sorted(p for p in base.rglob(pattern) if p.is_file()):
        if "__pycache__" in path.parts:
            continue
        name = path.relative_to(base).as_posix().encode()
        digest.update(len(name).to_bytes(8, "little") + name)
        digest.update(bytes.fromhex(file_sha256(path).removeprefix("sha256:")))
    return "sha256:" + digest.hexdigest()


def capture_identity(
    *,
    engine: EngineBuild,
    plugin_digest: str,
    model: ModelBinding,
    topology: Topology,
    snapshot: SnapshotDriver,
    device: int | None = None,
) -> Identity:
    """The identity of this process: the caller's facts plus the collected platform."""
    return Identity(
        engine=engine,
        plugin_digest=plugin_digest,
        model=model,
        topology=topology,
        platform=collect_platform(device),
        snapshot=snapshot,
    )
