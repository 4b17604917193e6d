"""What a driver needs from the engine adapter to start the engine: a command line and the
modules a template should import first, never the engine's internals."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from attrs import field, frozen


def _as_tuple(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value)


def _as_env(value: Mapping[str, str]) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()}


@frozen(kw_only=True)
class LaunchCommand:
    """How to start an engine: argv and the environment it adds, and the URL it will serve."""

    argv: tuple[str, ...] = field(converter=_as_tuple)
    env: dict[str, str] = field(factory=dict, converter=_as_env)
    url: str
    cwd: str | None = None


@runtime_checkable
class Launcher(Protocol):
    """Builds the engine's command for an operation. `workdir` is the operation's folder;
    `provider` is the weight provider the engine must start with (a restore may change it).

    `template_preload` lists the modules an n580 template imports before it is dumped;
    `forkserver_preload` those its forkserver imports so the engine's children start warm (None:
    the engine starts no children, no forkserver)."""

    template_preload: tuple[str, ...]
    forkserver_preload: tuple[str, ...] | None

    def command(self, request: Any, workdir: Path, *, provider: str) -> LaunchCommand: ...
