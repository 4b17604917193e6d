"""NCCL at the snapshot boundary: communicators cannot cross a CUDA checkpoint.

Before a checkpoint every NCCL communicator of the TP group must be torn down, and rebuilt
after restore before the weights resume. A TP group with no NCCL device group (CPU, or a
single rank) has nothing to tear down: the step is recorded as a no-op with its reason.
Tearing down a live multi-rank NCCL group is not implemented yet, so capture of such an
engine fails closed here instead of producing a capsule that cannot restore.
"""

from __future__ import annotations

from typing import Any

from coldsnap._errors import PluginError


class NcclBoundaryError(PluginError, RuntimeError):
    """The TP group has live NCCL communicators this build cannot take across a checkpoint."""


def _describe(group: Any) -> tuple[str | None, int]:
    import torch.distributed as dist

    world = int(getattr(group, "world_size", 1) or 1)
    device_group = getattr(group, "device_group", None)
    if device_group is None:
        return None, world
    try:
        backend = str(dist.get_backend(device_group))
    except Exception:  # not initialised in this process
        return None, world
    return backend, world


def _boundary(group: Any, phase: str) -> dict[str, Any]:
    backend, world = _describe(group)
    if backend != "nccl":
        return {
            "nccl": "noop",
            "phase": phase,
            "reason": f"TP device group backend is {backend or 'absent'}",
        }
    if world == 1:
        return {
            "nccl": "noop",
            "phase": phase,
            "reason": "single-rank TP group: no peer communicator",
        }
    raise NcclBoundaryError(
        f"NCCL {phase}: the TP group has {world} ranks on NCCL; taking NCCL communicators "
        "across a CUDA checkpoint is not implemented in this build"
    )


def prepare(group: Any) -> dict[str, Any]:
    """After release, before a checkpoint."""
    return _boundary(group, "prepare")


def restore(group: Any) -> dict[str, Any]:
    """After restore, before the weights resume."""
    return _boundary(group, "restore")
