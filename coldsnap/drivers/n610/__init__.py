"""n610: the whole initialized engine tree and its CUDA context, weights and KV left out."""

from __future__ import annotations

from typing import Any

from coldsnap.machine import Engine, Registry

from ._driver import N610Driver, default_cuda
from ._specs import CAPTURE, CUDA_PIDS, RESTORE, RUNTIME_DIR_AS, RUNTIME_DIR_MADE, STOP


def build(request: Any, engine: Engine) -> N610Driver:
    """A restore request's `replica` restores into a PID namespace of its own."""
    return N610Driver(
        launcher=engine.launcher,  # type: ignore[attr-defined]
        cuda=default_cuda(),
        restore_pid_namespace=bool(getattr(request, "replica", False)),
    )


def register(registry: Registry) -> None:
    """Entry point of `coldsnap.registrations`."""
    registry.register_driver(
        "n610",
        capture=CAPTURE,
        restore=RESTORE,
        stop=STOP,
        build=build,
        cls=N610Driver,
        capabilities={"resumes_process", "pid_namespaces"},
        doc="the whole initialized process tree and its CUDA state (CRIU + CUDA checkpoint)",
    )


__all__ = [
    "CAPTURE",
    "CUDA_PIDS",
    "RESTORE",
    "RUNTIME_DIR_AS",
    "RUNTIME_DIR_MADE",
    "STOP",
    "N610Driver",
    "build",
    "default_cuda",
    "register",
]
