"""Errors of the backends. Each says what failed and where the evidence is kept."""

from __future__ import annotations

from pathlib import Path


class BackendError(Exception):
    """Base of every error a backend raises on purpose (backends are leaves: no coldsnap base)."""


class CriuError(BackendError):
    """CRIU failed. The message carries CRIU's first error line and the path of the whole log."""

    def __init__(
        self,
        operation: str,
        problem: str,
        *,
        log_path: Path | None = None,
        first_error: str | None = None,
        returncode: int | None = None,
    ) -> None:
        self.operation = operation
        self.problem = problem
        self.log_path = log_path
        self.first_error = first_error
        self.returncode = returncode
        parts = [f"criu {operation}: {problem}"]
        if first_error:
            parts.append(f"first error: {first_error}")
        if log_path is not None:
            parts.append(f"whole log: {log_path}")
        super().__init__("; ".join(parts))


class CriuUnavailable(CriuError):
    """No usable CRIU here: missing binary, a version below the minimum, or `criu check` fails."""


class PidCollision(BackendError):
    """A PID that the image must take back is held by a live process or an unreaped zombie."""

    def __init__(self, pid: int, holder: str) -> None:
        self.pid = pid
        self.holder = holder
        super().__init__(
            f"PID {pid} is held by {holder}; a restore takes back the image's original PIDs. "
            "Stop and reap that process, or restore into a new PID namespace"
        )


class GpuMappingFound(BackendError):
    """A process maps (or holds open) an NVIDIA device file: it has CUDA driver state."""

    def __init__(self, pid: int, path: str) -> None:
        self.pid = pid
        self.path = path
        super().__init__(
            f"process {pid} maps or holds {path}: it has CUDA/NVIDIA driver state, which a "
            "plain CRIU image cannot hold"
        )


class LaunchError(BackendError):
    """A target process could not be started as asked."""
