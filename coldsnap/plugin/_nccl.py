"""NCCL at the snapshot boundary: communicators cannot cross a CUDA checkpoint.

Before a checkpoint every NCCL communicator of the TP group is torn down (SGLang's PyNccl
communicator, its custom all-reduce, and the NCCL backend of the torch device group), and
after restore, before the weights resume, they are built again over the group's gloo CPU
group, which CRIU brings back with its connections (`--tcp-established`). Building is a
collective: every rank does it at the same point of the same resume, which the resume's
stage 1 guarantees.

A TP group with no NCCL device group (CPU: gloo, as on the CPU hosts of the tests) or a single
rank has nothing to tear down: the step is recorded as a no-op with its reason. A group that is
absent or whose backend cannot be read fails closed (NcclBoundaryError names it).
"""

from __future__ import annotations

from typing import Any, Protocol

from coldsnap._errors import PluginError


class NcclBoundaryError(PluginError, RuntimeError):
    """The TP group's NCCL communicators could not be described, torn down or rebuilt."""


class Communicators(Protocol):
    """How the communicators of an SGLang GroupCoordinator are made and unmade (the real ones:
    `SGLangCommunicators`; the tests hand a fake)."""

    def teardown(self, group: Any) -> list[str]: ...
    def rebuild(self, group: Any) -> list[str]: ...


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


def _noop(group: Any, phase: str) -> dict[str, Any] | None:
    """The no-op record, or None when the group holds NCCL communicators across ranks."""
    backend, world, why = _describe(group, phase)
    if backend != "nccl":
        return {"nccl": "noop", "phase": phase, "reason": why}
    if world == 1:
        return {"nccl": "noop", "phase": phase, "reason": "single-rank TP group: no peer"}
    return None


def prepare(group: Any, comms: Communicators | None = None) -> dict[str, Any]:
    """After release, before a checkpoint: tears down the group's NCCL communicators."""
    noop = _noop(group, "prepare")
    if noop is not None:
        return noop
    try:
        done = (comms or SGLangCommunicators()).teardown(group)
    except (RuntimeError, ValueError, AttributeError, OSError) as exc:
        raise NcclBoundaryError(
            f"NCCL prepare: teardown failed: {type(exc).__name__}: {exc}"
        ) from exc
    return {"nccl": "torn_down", "phase": "prepare", "world_size": group.world_size, "done": done}


def restore(group: Any, comms: Communicators | None = None) -> dict[str, Any]:
    """After restore, before the weights resume: builds again what `prepare` tore down. A
    group whose communicators were never torn down (only the KV cache was released) keeps
    them."""
    noop = _noop(group, "restore")
    if noop is not None:
        return noop
    if not getattr(group, "coldsnap_nccl_torn_down", None):
        return {"nccl": "noop", "phase": "restore", "reason": "nothing was torn down"}
    try:
        done = (comms or SGLangCommunicators()).rebuild(group)
    except (RuntimeError, ValueError, AttributeError, OSError) as exc:
        raise NcclBoundaryError(
            f"NCCL restore: rebuild failed: {type(exc).__name__}: {exc}"
        ) from exc
    return {"nccl": "rebuilt", "phase": "restore", "world_size": group.world_size, "done": done}


class SGLangCommunicators:
    """The communicators SGLang's GroupCoordinator holds on CUDA (0.5.17 and 0.5.23 spell them
    alike): `pynccl_comm` (PyNcclCommunicator), `ca_comm` (custom all-reduce), `device_group`
    (a torch ProcessGroup on NCCL). Teardown marks the group (`coldsnap_nccl_torn_down`) so that
    a rebuild knows what to make again."""

    def teardown(self, group: Any) -> list[str]:
        import torch
        import torch.distributed as dist

        torch.cuda.synchronize()
        done = []
        pynccl = getattr(group, "pynccl_comm", None)
        if pynccl is not None:
            pynccl.nccl.ncclCommDestroy(pynccl.comm)
            group.pynccl_comm = None
            done.append("pynccl_comm")
        ca = getattr(group, "ca_comm", None)
        if ca is not None:
            ca.close()
            group.ca_comm = None
            done.append("ca_comm")
        if group.device_group is not None:
            dist.destroy_process_group(group.device_group)
            group.device_group = None
            done.append("device_group")
        group.coldsnap_nccl_torn_down = done
        return done

    def rebuild(self, group: Any) -> list[str]:
        import torch.distributed as dist

        torn = list(group.coldsnap_nccl_torn_down)
        done = []
        if "device_group" in torn:
            group.device_group = dist.new_group(ranks=list(group.ranks), backend="nccl")
            done.append("device_group")
        if "pynccl_comm" in torn:
            from sglang.srt.distributed.device_communicators.pynccl import PyNcclCommunicator

            group.pynccl_comm = PyNcclCommunicator(group=group.cpu_group, device=group.device)
            done.append("pynccl_comm")
        if "ca_comm" in torn:
            from sglang.srt.distributed.device_communicators.custom_all_reduce import (
                dispatch_custom_allreduce,
            )

            cls = dispatch_custom_allreduce(group=group.cpu_group, device=group.device)
            group.ca_comm = cls(group=group.cpu_group, device=group.device)
            done.append("ca_comm")
        group.coldsnap_nccl_torn_down = False
        return done


__all__ = ["Communicators", "NcclBoundaryError", "SGLangCommunicators", "prepare", "restore"]
