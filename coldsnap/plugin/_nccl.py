"""NCCL at the snapshot boundary: communicators cannot cross a CUDA checkpoint.

Before a checkpoint every NCCL communicator of the TP group must be torn down, and rebuilt
after restore before the weights resume. A TP group with no NCCL device group (CPU, or a
single rank) has nothing to tear down: the step is recorded as a no-op with its reason. A group
that is absent or whose backend cannot be read fails closed (NcclBoundaryError names it).
Tearing down a live multi-rank NCCL group is not implemented yet, so capture of such an
engine fails closed here instead of producing a capsule that cannot restore.
"""

from __future__ import annotations

from typing import Any

from coldsnap._errors import PluginError


class NcclBoundaryError(PluginError, RuntimeError):
    """The TP group has live NCCL communicators this build cannot take across a checkpoint."""


def _describe(group: Any, phase: str) -> tuple[str | None, int, str]:
    """(backend, world size, why) of the TP group's device group. A group that is absent, or
    whose backend cannot be read while torch.distributed is up, fails closed."""
    import torch.distributed as dist

    if group is None:
        raise NcclBoundaryError(
            f"NCCL {phase}: the TP group is absent, so its communicators cannot be described"
        )
    world = getattr(group, "world_size", None)
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise NcclBoundaryError(f"NCCL {phase}: the TP group's world_size is {world!r}")
    device_group = getattr(group, "device_group", None)
    if device_group is None:
        return None, world, "the TP group has no device group"
    if not (dist.is_available() and dist.is_initialized()):
        return None, world, "torch.distributed is not initialised in this process"
    try:
        backend = str(dist.get_backend(device_group))
    except (RuntimeError, ValueError) as exc:
        raise NcclBoundaryError(
            f"NCCL {phase}: the backend of the TP device group cannot be read "
            f"({type(exc).__name__}: {exc})"
        ) from None
    return backend, world, f"TP device group backend is {backend}"


def _boundary(group: Any, phase: str) -> dict[str, Any]:
    backend, world, why = _describe(group, phase)
    if backend != "nccl":
        return {"nccl": "noop", "phase": phase, "reason": why}
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
