"""x100: a throwaway third snapshot driver, written the way a third party would write one.

It is one package (its facts and specs in `_specs`, its steps in `_driver`) plus its
registration (`register`, what an entry point of `coldsnap.registrations` would name). Nothing
in coldsnap knows it: the shared steps come from coldsnap.machine.steps, the guards from
coldsnap.machine, and the store carries its carried fact because the spec says so.

It "parks" an engine: at capture, the released engine's process is copied into a slot and the
source retired; at restore the copy is started again from the slot and its weights refilled.
Its steps run on the in-memory world of coldsnap.testing (it is a test driver), so its
factory needs the in-memory engine's launcher, which knows the world.
"""

from __future__ import annotations

from typing import Any

from coldsnap.machine import Engine, Registry

from ._driver import X100Driver
from ._specs import CAPTURE, RESTORE, SLOT, STOP

NAME = "x100"


def build(request: Any, engine: Engine) -> X100Driver:
    return X100Driver(engine.launcher)  # type: ignore[arg-type]


def register(registry: Registry) -> None:
    """The entry point of `coldsnap.registrations` a real package would list."""
    registry.register_driver(
        NAME,
        capture=CAPTURE,
        restore=RESTORE,
        stop=STOP,
        build=build,
        cls=X100Driver,
        doc="parks the released engine's process in a slot (a test driver)",
    )


__all__ = ["CAPTURE", "NAME", "RESTORE", "SLOT", "STOP", "X100Driver", "build", "register"]
