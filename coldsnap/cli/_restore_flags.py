"""Engine flags given to `coldsnap restore NAME -- FLAGS`: set over the capsule's own, and refused
before anything starts where the restore could not honour them.

Each flag after `--` replaces the capsule's occurrences of that flag (the others stay), so a
restore names only what it changes. Whether a change can be honoured is the components'
answer, not a driver's name: a driver that resumes the captured process (capability
`resumes_process`) runs it with the flags it was started with, so it honours no change at
all; a driver that builds the engine at restore honours what the engine adapter lets differ
(`engine_args_differences`: flags that change only what the engine reports). Anything else
would be refused by admission after the workdir and journal exist (IncompatibleArtifact, exit
3); here it is a bad request (exit 2) naming each flag.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from coldsnap.engines._args import differences
from coldsnap.machine import REGISTRY, RequestError

_RESUMES = "resumes_process"
_NUMBER = re.compile(r"^-\d")


def _groups(args: Sequence[str]) -> list[tuple[str, list[str]]]:
    """(flag, its tokens) in order, grouped as engine arguments are compared (engines._args): a
    flag with the values that follow it up to the next flag ('' for leading positional
    values; a negative number is a value)."""
    out: list[tuple[str, list[str]]] = []
    for arg in args:
        if arg.startswith("-") and arg != "-" and not _NUMBER.match(arg):
            out.append((arg.partition("=")[0], [arg]))
        elif out:
            out[-1][1].append(arg)
        else:
            out.append(("", [arg]))
    return out


def set_over(captured: Sequence[str], given: Sequence[str]) -> tuple[str, ...]:
    """The capsule's engine flags without those `given` names, then `given` as written: each
    flag given replaces every occurrence of that flag in the capsule's."""
    named = {flag for flag, _ in _groups(given)}
    kept = [tokens for flag, tokens in _groups(captured) if flag not in named]
    return tuple(token for tokens in kept for token in tokens) + tuple(given)


def check_honoured(
    engine_adapter: Any, driver: str, captured: Sequence[str], requested: Sequence[str]
) -> None:
    """Refuses (RequestError, one problem per flag) the flag changes this restore would not
    honour; `driver` must be registered (the caller's registry check names it otherwise)."""
    if _RESUMES in REGISTRY.capabilities("driver", driver):
        why = (f"driver {driver} resumes the captured process, which keeps the flags it was "
               "started with: capture again with this flag")  # fmt: skip
        found = differences(captured, requested)
    else:
        why = ("the capsule binds the flags that shape the engine: capture again with this "
               "flag (only flags that change what the engine reports may differ)")  # fmt: skip
        found = engine_adapter.engine_args_differences(captured, requested)
    problems = [
        (d.field.removeprefix("engine_args "), f"captured {d.expected}, asked {d.found}: {why}")
        for d in found
    ]
    if problems:
        raise RequestError(problems)


__all__ = ["check_honoured", "set_over"]
