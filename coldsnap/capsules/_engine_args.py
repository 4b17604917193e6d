"""Which engine arguments a capsule binds: a restore may not change the engine it restores.

A capsule is an engine built with the capture's arguments (n610 restores that very process; n580
builds the engine again around the restored template with the restore's arguments), so every
argument that shapes the engine (dtype, memory fraction, context length, attention backend,
quantization, anything unknown) must be the same at restore. Allowed to differ:
- flags that only change what the engine reports (logging, metrics): `ALLOWED`. On n610 they
  take no effect at restore (the process is restored as it was captured);
- `--host` and `--port`: coldsnap's to set (a request naming them is refused before this).

Arguments are compared as flags with their values, in any order: `--a 1 --b` equals `--b
--a=1`. A flag that appears twice keeps both values, in order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from coldsnap.artifacts import Difference

ALLOWED: frozenset[str] = frozenset(
    {
        "--log-level",
        "--log-level-http",
        "--log-requests",
        "--log-requests-level",
        "--show-time-cost",
        "--decode-log-interval",
        "--enable-metrics",
        "--enable-request-time-stats-logging",
        "--crash-dump-folder",
    }
)
"""Flags that change what an engine reports, never what it computes or how it is laid out."""
COLDSNAP_OWNED: frozenset[str] = frozenset({"--host", "--port"})
"""Flags coldsnap sets on every launch."""

_NUMBER = re.compile(r"^-\d")
_POSITIONAL = ""


def parse(args: Iterable[str]) -> dict[str, list[tuple[str, ...]]]:
    """flag -> the values of each of its occurrences. Leading positional arguments sit under
    the flag ''."""
    out: dict[str, list[tuple[str, ...]]] = {}
    flag: str = _POSITIONAL
    values: list[str] = []
    for arg in args:
        if arg.startswith("-") and not _NUMBER.match(arg) and arg != "-":
            if flag != _POSITIONAL or values:
                out.setdefault(flag, []).append(tuple(values))
            flag, _, inline = arg.partition("=")
            values = [inline] if "=" in arg else []
        else:
            values.append(arg)
    if flag != _POSITIONAL or values:
        out.setdefault(flag, []).append(tuple(values))
    return out


def differences(captured: Iterable[str], requested: Iterable[str]) -> list[Difference]:
    """One Difference per engine-changing flag whose occurrences differ, named
    `engine_args <flag>`, with the captured and the requested values ('absent' when a side
    does not name the flag)."""
    ignored = ALLOWED | COLDSNAP_OWNED
    was, now = parse(captured), parse(requested)
    found = []
    for flag in sorted((set(was) | set(now)) - ignored):
        if was.get(flag) != now.get(flag):
            name = f"engine_args {flag}" if flag else "engine_args (positional)"
            found.append(Difference(name, _show(flag, was.get(flag)), _show(flag, now.get(flag))))
    return found


def _show(flag: str, occurrences: list[tuple[str, ...]] | None) -> str:
    if occurrences is None:
        return "absent"
    return "; ".join(" ".join(filter(None, (flag, *values))) for values in occurrences)


__all__ = ["ALLOWED", "COLDSNAP_OWNED", "differences", "parse"]
