"""Engine arguments compared as flags with their values, in any order and spelling: `--a 1 --b`
equals `--b --a=1`; a flag given twice keeps both values, in order. Which flags may differ
between a capture and a restore is each engine's policy (SGLang's: coldsnap.engines.sglang);
this module only knows how command-line flags group.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from coldsnap.artifacts import Difference

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


def differences(
    captured: Iterable[str], requested: Iterable[str], *, may_differ: frozenset[str] = frozenset()
) -> list[Difference]:
    """One Difference per flag outside `may_differ` whose occurrences differ, named
    `engine_args <flag>`, with the captured and the requested values ('absent' when a side
    does not name the flag)."""
    was, now = parse(captured), parse(requested)
    found = []
    for flag in sorted((set(was) | set(now)) - may_differ):
        if was.get(flag) != now.get(flag):
            name = f"engine_args {flag}" if flag else "engine_args (positional)"
            found.append(Difference(name, _show(flag, was.get(flag)), _show(flag, now.get(flag))))
    return found


def _show(flag: str, occurrences: list[tuple[str, ...]] | None) -> str:
    if occurrences is None:
        return "absent"
    return "; ".join(" ".join(filter(None, (flag, *values))) for values in occurrences)


__all__ = ["differences", "parse"]
