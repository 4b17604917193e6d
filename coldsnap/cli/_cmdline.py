"""The user's own launch command line, read into what a capture request needs (the model path,
the tensor-parallel size, the draft model, the engine's other flags unchanged and in their
order) by the engine adapter the request will use: each engine owns its launch-line policy
(which flags coldsnap sets itself, refuses, or reads into the request). Nothing here starts
anything or reads a file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from coldsnap.machine import (
    REGISTRY,
    CaptureRequest,
    CommandLineError,
    ComponentError,
    LaunchLine,
    Registry,
)

DEFAULT_ENGINE: str = attrs.fields(CaptureRequest).engine.default


def engine_adapter(name: str = DEFAULT_ENGINE, registry: Registry = REGISTRY) -> Any:
    """The registered engine adapter `name`, built as a request would build it. The command
    line is read before there is a request, so its factory is given none."""
    return registry.get("engine", name).build(None)


def parse_launch(argv: Sequence[str], engine: Any = None) -> LaunchLine:
    """The launch command line `argv`, read by `engine` (an engine adapter; default: the
    registered adapter of a capture request's default engine). CommandLineError names every
    flag the engine cannot capture."""
    adapter = engine if engine is not None else engine_adapter()
    line = adapter.parse_command_line(list(argv))
    if not isinstance(line, LaunchLine):
        raise ComponentError(
            f"engine adapter {type(adapter).__name__}: parse_command_line returned {line!r}, "
            "not a LaunchLine"
        )
    return line


def notice(line: LaunchLine) -> str:
    """What coldsnap changes in the user's command line, for stderr."""
    owned = " and ".join(line.owned) or "where the engine listens"
    text = f"the capture serves on 127.0.0.1 at a free port coldsnap picks ({owned} are "
    text += "coldsnap's)"
    if line.port is not None or line.host is not None:
        where = f"{line.host or '127.0.0.1'}:{line.port or '(the capture port)'}"
        text += f"; restores serve on your {where} unless given --host/--port"
    return text


__all__ = ["CommandLineError", "LaunchLine", "engine_adapter", "notice", "parse_launch"]
