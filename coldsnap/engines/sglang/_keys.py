"""SGLang's `--api-key` under coldsnap: a request says only that the engine is keyed (the bare
flag `--api-key` in its engine arguments, which the capsule binds), and the key itself travels
as a file (coldsnap._wire's key record, mode 0600), never as a request field, an argument or a
variable that a journal, a capsule or a snapshot keeps.

- capture: the engine starts with a throw-away key coldsnap makes; it is written into the
  capture's workdir (for coldsnap's own requests) and the engine's runtime directory (for the
  plugin's key check). The operator's key never reaches the captured process.
- restore: the key given to the restore (the command line writes it into the restore's
  workdir) is handed to the engine's runtime directory, where the plugin reads it on every
  request: an engine built at restore (n580) also gets it as its `--api-key`; a resumed process
  (n610) keeps the throw-away in its memory, which the plugin no longer accepts.
- sleep and wake send the key of the restore they act on (its workdir's key file).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coldsnap._errors import RefusedError
from coldsnap._wire import KeyFileError, key_path, read_key, write_key
from coldsnap.machine import RequestError

KEY_FLAG = "--api-key"


class KeyMissing(RequestError):
    """A keyed engine's operation has no key to give it: the message names the file."""

    def __init__(self, path: Path) -> None:
        why = (f"{KEY_FLAG}: the engine is keyed and {path} holds no key (a restore is given "
               "one: coldsnap restore NAME -- --api-key KEY)")  # fmt: skip
        super().__init__([("engine_args", why)])


class KeyConflict(RefusedError, RuntimeError):
    """The engine's runtime directory holds another key than the one this restore was given."""


def keyed(engine_args: Sequence[str]) -> bool:
    """Whether engine arguments ask for a keyed engine (the bare flag)."""
    return KEY_FLAG in engine_args


def key_folder(request: Any) -> Path:
    """Where an operation's key file is: a capture's or restore's workdir, or for a stop, sleep
    or wake the workdir of the restore it acts on (its `target`)."""
    return Path(getattr(request, "target", None) or request.workdir)


def operation_key(request: Any) -> str | None:
    """The key this operation's requests carry, from its key file (None: not keyed)."""
    return read_key(key_folder(request))


def headers(request: Any) -> dict[str, str]:
    """The HTTP headers that authenticate coldsnap's own requests to a keyed engine."""
    key = operation_key(request)
    return {"Authorization": f"Bearer {key}"} if key else {}


def launch_key(request: Any, runtime_dir: Path) -> list[str]:
    """The `--api-key VALUE` arguments of an engine started for `request` (none when it is not
    keyed), with the key written where the plugin and coldsnap's requests read it: at capture
    a fresh throw-away (in the workdir and the runtime directory), at restore the key the
    restore was given (KeyMissing without one)."""
    if not keyed(request.engine_args):
        return []
    if request.operation == "capture":
        key = secrets.token_urlsafe(32)
        write_key(key_folder(request), key)
    else:
        key = _given(request)
    write_key(runtime_dir, key)
    return [KEY_FLAG, key]


def hand_over(request: Any, runtime_dir: Path) -> None:
    """Gives a resumed keyed engine the restore's key (its runtime directory's key file, which
    the plugin checks every request against); nothing for an engine that is not keyed.

    A runtime directory that already holds another key is another engine's too (a replica of
    the capsule shares it with the restore or the kept source beside it: the path is in the
    image's environment), and rewriting it would change that serving engine's key: KeyConflict
    (the key of a resumed restore of this workdir is the same, and is written again)."""
    if not keyed(request.engine_args):
        return
    key = _given(request)
    try:
        held = read_key(runtime_dir)
    except KeyFileError as exc:
        raise KeyConflict(f"{exc}: the runtime directory of a keyed engine") from None
    if held is not None and held != key:
        raise KeyConflict(
            f"{key_path(runtime_dir)} holds another key: an engine restored from this capsule "
            "serves beside this one with it (replicas share the runtime directory in their "
            "image): give this restore the same key, or stop that engine"
        )
    write_key(runtime_dir, key)


def give_key(workdir: Path, key: str) -> Path:
    """Gives the restore whose workdir is `workdir` the key its engine requires (the key file
    there, 0600; the workdir is made 0700 as the machine makes it); returns the file."""
    Path(workdir).mkdir(parents=True, exist_ok=True, mode=0o700)
    return write_key(Path(workdir), key)


def given_key(workdir: Path) -> str | None:
    """The key a restore whose workdir is `workdir` was given (None: none yet)."""
    return read_key(Path(workdir))


def _given(request: Any) -> str:
    key = operation_key(request)
    if key is None:
        raise KeyMissing(key_path(key_folder(request)))
    return key


def engine_argv(argv: Sequence[str], key_args: Sequence[str]) -> list[str]:
    """The engine's command line with the bare `--api-key` of its engine arguments replaced by
    `key_args` (`--api-key VALUE`)."""
    out: list[str] = []
    for token in argv:
        out += list(key_args) if token == KEY_FLAG else [token]
    return out


__all__ = ["KEY_FLAG", "KeyConflict", "KeyMissing", "engine_argv", "give_key", "given_key",
           "hand_over", "headers", "key_folder", "keyed", "launch_key",
           "operation_key"]  # fmt: skip
