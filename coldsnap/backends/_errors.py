"""Errors of the backends. Each keeps what failed as fields (callers branch on them, not on the
message) and says where the evidence is kept.

Backends are leaves: the root of coldsnap's exception tree is the only coldsnap module they
import (besides coldsnap._atomic).
"""

from __future__ import annotations

from pathlib import Path

from attrs import define

from coldsnap._errors import EnvironmentMissing, OperationError


def _say(headline: str, *details: tuple[str, object]) -> str:
    """The headline, then each detail that is set, as `label value`, joined by '; '."""
    return "; ".join([headline, *(f"{label} {value}" for label, value in details if value)])


class BackendError(OperationError):
    """Base of every error a backend raises on purpose."""


@define(auto_exc=True)
class CriuError(BackendError):
    """CRIU failed. The message carries CRIU's first error line and the path of the whole log."""

    operation: str
    problem: str
    log_path: Path | None = None
    first_error: str | None = None
    returncode: int | None = None

    def __str__(self) -> str:
        return _say(
            f"criu {self.operation}: {self.problem}",
            ("first error:", self.first_error),
            ("whole log:", self.log_path),
        )


class CriuUnavailable(CriuError, EnvironmentMissing):
    """No usable CRIU here: missing binary, a version below the minimum, or `criu check` fails."""


@define(auto_exc=True)
class CudaCheckpointError(BackendError):
    """A checkpoint API call failed or found the process in a state it cannot act on.

    `result` is the CUresult name (for example CUDA_ERROR_NOT_READY) when the driver refused,
    None when the state itself was wrong."""

    operation: str
    pid: int | None
    problem: str
    result: str | None = None
    state: str | None = None

    def __str__(self) -> str:
        where = f" pid {self.pid}" if self.pid is not None else ""
        return _say(
            f"cuda {self.operation}{where}: {self.problem}",
            ("driver said", self.result),
            ("process state", self.state),
        )


@define(auto_exc=True)
class PidCollision(BackendError):
    """A PID that the image must take back is held by a live process or an unreaped zombie."""

    pid: int
    holder: str

    def __str__(self) -> str:
        return (
            f"PID {self.pid} is held by {self.holder}; a restore takes back the image's original "
            "PIDs. Stop and reap that process, or restore into a new PID namespace"
        )


@define(auto_exc=True)
class GpuMappingFound(BackendError):
    """A process maps (or holds open) an NVIDIA device file: it has CUDA driver state."""

    pid: int
    path: str

    def __str__(self) -> str:
        return (
            f"process {self.pid} maps or holds {self.path}: it has CUDA/NVIDIA driver state, "
            "which a plain CRIU image cannot hold"
        )


class LaunchError(BackendError):
    """A target process could not be started as asked."""


class BackendArgumentError(BackendError, ValueError):
    """A call names what it cannot act on: a path that must not exist yet exists, a process
    that is gone, a negative timeout. Raised before anything is changed. A ValueError too,
    as these were."""


@define(auto_exc=True)
class PidStillHeld(BackendError, TimeoutError):
    """A PID that was waited for is still held when the wait ends. A TimeoutError too: the
    tree-stopping helpers wait for each member in turn and go on past one that outlives its
    wait."""

    pid: int
    holder: str
    timeout_s: float

    def __str__(self) -> str:
        return f"PID {self.pid} is still held by {self.holder} after {self.timeout_s} s"
