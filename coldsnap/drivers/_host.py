"""What the drivers need of this host before a capture or restore starts (coldsnap.machine's
HostNeed): the CRIU binary their dump or restore will run, and where the CUDA driver is loaded,
the checkpoint API through which a driver that snapshots the engine's GPU state moves it.

Every probe is cheap and certain. Root is asked of the kernel (CRIU refuses to run without it);
CRIU is asked `criu --version` (a few milliseconds), the
same question, through the same path, that the dump or restore asks first; `criu check` is left
to `coldsnap doctor`, as some of what it reports (a kernel feature these processes do not use)
does not stop a dump. The CUDA probe asks the backend the driver already built; it is declared
only on a host whose NVIDIA driver is loaded.
"""

from __future__ import annotations

import os
import subprocess

from coldsnap.backends import Criu, CriuUnavailable, CudaCheckpoint, gpu_host
from coldsnap.machine import HostNeed

CRIU_OPERATIONS = frozenset({"capture", "restore"})
"""The operations whose steps run CRIU (a dump, a restore); a stop only stops processes."""


def criu_needs(criu: Criu) -> list[HostNeed]:
    """Root, which CRIU needs to dump and restore processes, and CRIU at least at
    `criu.minimum`, runnable at the path this driver will run it from."""
    want = ".".join(map(str, criu.minimum))
    where = str(criu.binary) if criu.binary is not None else "(none found: COLDSNAP_CRIU unset)"
    return [
        HostNeed("root (CRIU dumps and restores processes as root)", _root_problem),
        HostNeed(f"CRIU >= {want} at {where}", lambda: _criu_problem(criu)),
    ]


def _root_problem() -> str | None:
    uid = os.geteuid()
    return None if uid == 0 else f"running as uid {uid}"


def _criu_problem(criu: Criu) -> str | None:
    try:
        criu.require_version()
    except CriuUnavailable as exc:
        return str(exc)
    except subprocess.TimeoutExpired as exc:
        return f"{criu.binary} --version did not answer within {exc.timeout} s"
    return None


def cuda_need(backend: object | None) -> HostNeed | None:
    """On a host with the NVIDIA driver loaded, the checkpoint API: met when the driver was
    built with a backend (its `cuda` capability), else the API's own reason it is unusable.
    None (no need) on a host without the NVIDIA driver: the engine serves on CPU there."""
    if not gpu_host():
        return None
    return HostNeed(
        "the CUDA driver's checkpoint API (cuda-bindings 12.8+, driver r570+)",
        lambda: None if backend is not None else _cuda_problem(),
    )


def _cuda_problem() -> str:
    return CudaCheckpoint().problem() or "the driver was built without it"


__all__ = ["CRIU_OPERATIONS", "criu_needs", "cuda_need"]
