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

`--api-key KEY` is the one flag whose value never joins the request: the request keeps the
bare flag (the engine is keyed, which the capsule binds) and the key goes into the restore's
workdir as a key file (mode 0600) for the engine adapter to hand to the engine
(coldsnap.engines.sglang._keys). A keyed capsule restored without a key is refused, and so is a
key for a capsule captured without one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coldsnap.engines._args import differences
from coldsnap.machine import REGISTRY, RequestError

KEY_FLAG = "--api-key"

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


def split_key(
    given: Sequence[str], *, bare: bool = False
) -> tuple[tuple[str, ...], str | None]:
    """The engine flags `given` with `--api-key KEY` (or `--api-key=KEY`) made the bare flag,
    and the key (None when none is given); RequestError for the flag without a key, unless
    `bare` lets it stand (a request file's engine arguments: its workdir holds the key)."""
    out: list[str] = []
    keys: set[str] = set()
    tokens = list(given)
    at = 0
    while at < len(tokens):
        name, eq, inline = tokens[at].partition("=")
        at += 1
        if name != KEY_FLAG:
            out.append(tokens[at - 1])
            continue
        if eq:
            value: str | None = inline
        elif at < len(tokens) and not tokens[at].startswith("-"):
            value, at = tokens[at], at + 1
        else:
            value = None
        if value:
            keys.add(value)
        elif not (bare and not eq):
            raise RequestError([(KEY_FLAG, "needs the key: -- --api-key KEY")])
        if KEY_FLAG not in out:
            out.append(KEY_FLAG)
    if len(keys) > 1:
        raise RequestError([(KEY_FLAG, "is given twice with different keys")])
    return tuple(out), next(iter(keys), None)


def check_key(
    engine_args: Sequence[str], key: str | None, artifact: str, workdir: str | None = None
) -> None:
    """Refuses (RequestError) a restore of a keyed capsule (its engine arguments name the bare
    `--api-key`) that is given no key, here or as the key file of its `workdir` (a request
    file's): it would serve nothing, since its engine requires the key this restore hands
    it."""
    if KEY_FLAG in engine_args and key is None and not (workdir and _has_key(workdir)):
        raise RequestError([(KEY_FLAG, f"capsule {artifact} was captured with --api-key: give "
                             "this restore the key it serves with: -- --api-key KEY")])  # fmt: skip


def _has_key(workdir: str) -> bool:
    from coldsnap.engines.sglang import given_key

    return given_key(Path(workdir)) is not None


def give_key(workdir: str, key: str) -> None:
    """Writes `key` as the restore's key file in `workdir` (the engine adapter hands it on)."""
    from coldsnap.engines.sglang import give_key as write  # SGLang's import cost: restores only

    write(Path(workdir), key)


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
    unkeyed = ("the capsule was captured without --api-key, so its engine checks no key: "
               "capture again with --api-key to serve with one")  # fmt: skip
    problems = [
        (flag, unkeyed if flag == KEY_FLAG else f"captured {d.expected}, asked {d.found}: {why}")
        for d in found
        for flag in [d.field.removeprefix("engine_args ")]
    ]
    if problems:
        raise RequestError(problems)


__all__ = ["KEY_FLAG", "check_honoured", "check_key", "give_key", "set_over", "split_key"]
