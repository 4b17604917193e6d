"""n580: a context-free pre-exec template, restored and released into engine construction."""

from __future__ import annotations

from typing import Any

from coldsnap.machine import Engine, Registry

from ._driver import N580Driver
from ._specs import (
    CAPTURE,
    CONTROL_DIR,
    FORKSERVER_ADDRESS,
    IMPORT_SECONDS,
    RESTORE,
    STOP,
    TEMPLATE_ID,
    TEMPLATE_PID,
)


def build(request: Any, engine: Engine) -> N580Driver:
    launcher = engine.launcher  # type: ignore[attr-defined]
    return N580Driver(
        launcher=launcher,
        preload=launcher.template_preload,
        forkserver_preload=launcher.forkserver_preload,
        template_env=getattr(launcher, "template_env", None),
    )


def register(registry: Registry) -> None:
    """Entry point of `coldsnap.registrations`."""
    registry.register_driver(
        "n580",
        capture=CAPTURE,
        restore=RESTORE,
        stop=STOP,
        build=build,
        cls=N580Driver,
        doc="a context-free template restored, then the engine built around the weights",
    )


__all__ = [
    "CAPTURE",
    "CONTROL_DIR",
    "FORKSERVER_ADDRESS",
    "IMPORT_SECONDS",
    "RESTORE",
    "STOP",
    "TEMPLATE_ID",
    "TEMPLATE_PID",
    "N580Driver",
    "build",
    "register",
]
