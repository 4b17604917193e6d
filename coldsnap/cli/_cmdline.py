"""The user's own launch command line (`python -m sglang.launch_server --model-path M ...` or
`sglang serve ...`), read into what a capture request needs: the model path, the tensor-parallel
size (the request's `tp`, from which the launcher sets --tp-size) and the engine's other flags,
unchanged and in their order.

coldsnap owns only where the engine listens: `--host` and `--port` are taken out (the capture
serves on 127.0.0.1 at a port coldsnap picks) and kept in the capsule, where a restore serves
unless told otherwise. A flag that
coldsnap cannot honour is refused by name, with why; every other flag goes to the engine as
written. Nothing here starts anything or reads a file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from attrs import frozen

from coldsnap.machine import RequestError

MODULE = "sglang.launch_server"

_MODEL = ("--model-path", "--model")
_TP = ("--tp-size", "--tp", "--tensor-parallel-size")
_OWNED = ("--host", "--port")
_DRAFT = ("--speculative-draft-model-path", "--speculative-draft-model-revision")
"""The draft model becomes the request's `draft` (the capsule binds it)."""
_ONE = {
    "--pp-size": "a capsule holds one pipeline stage",
    "--pipeline-parallel-size": "a capsule holds one pipeline stage",
    "--dp-size": "a capsule holds one data-parallel replica",
    "--data-parallel-size": "a capsule holds one data-parallel replica",
    "--nnodes": "a capsule holds the processes of one host",
}
"""Flags coldsnap honours only at their default of 1, with why."""
_REFUSED = {
    "--config": "coldsnap must see every flag (model, host, port): pass them on the command line",
    "--api-key": "coldsnap's own requests to the engine (health, release, acceptance) carry no key",
    "--ssl-keyfile": "coldsnap speaks plain HTTP to the engine",
    "--ssl-certfile": "coldsnap speaks plain HTTP to the engine",
    "--skip-tokenizer-init": "the acceptance request sends text, which needs the tokenizer",
    "--grpc-mode": "coldsnap drives the engine through its HTTP endpoints",
    "--smg-grpc-mode": "coldsnap drives the engine through its HTTP endpoints",
    "--node-rank": "a capsule holds the processes of one host",
    "--dist-init-addr": "a capsule holds the processes of one host",
}
"""Flags coldsnap cannot honour at all, with why."""
_VALUED = (*_MODEL, *_TP, *_OWNED, *_DRAFT, *_ONE, "--config", "--api-key", "--ssl-keyfile",
           "--ssl-certfile", "--node-rank", "--dist-init-addr")  # fmt: skip
"""Flags read here that take a value (as `--flag value` or `--flag=value`)."""
_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")


class CommandLineError(RequestError):
    """A launch command line coldsnap cannot capture; each problem names the flag (or the
    command) and why."""


@frozen
class LaunchLine:
    """What a launch command line asks for, in a capture request's terms."""

    model_path: str
    tp: int
    engine_args: tuple[str, ...]
    host: str | None
    """The user's --host, which coldsnap does not use (None when not given)."""
    port: int | None
    """The user's --port, which coldsnap does not use at capture (None when not given)."""
    program: str
    """How the command started: `python -m sglang.launch_server` or `sglang serve`."""
    draft_path: str | None = None
    """The speculative draft model (--speculative-draft-model-path), if any."""
    draft_revision: str | None = None


def _flags(argv: Sequence[str]) -> list[tuple[str, str | None, list[str]]]:
    """(flag, its value or None, the tokens it took) for each flag; a bare token that follows
    no valued flag comes back as ('', token, [token])."""
    out: list[tuple[str, str | None, list[str]]] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, inline = token.partition("=")
        if token.startswith("--") and name in _VALUED:
            if eq:
                out.append((name, inline, [token]))
                i += 1
                continue
            if i + 1 >= len(argv):
                raise CommandLineError([(name, "is missing its value")])
            out.append((name, argv[i + 1], [token, argv[i + 1]]))
            i += 2
            continue
        out.append((name if token.startswith("--") else "", None if token.startswith("--")
                    else token, [token]))  # fmt: skip
        i += 1
    return out


def _program(argv: Sequence[str]) -> tuple[str, list[str]]:
    head = os.path.basename(argv[0]) if argv else ""
    if _PYTHON.match(head) and len(argv) >= 3 and argv[1] == "-m" and argv[2] == MODULE:
        return f"python -m {MODULE}", list(argv[3:])
    if head == "sglang" and len(argv) >= 2 and argv[1] == "serve":
        return "sglang serve", list(argv[2:])
    shown = " ".join(argv[:3]) or "nothing"
    raise CommandLineError(
        [
            (
                "command",
                f"coldsnap captures `python -m {MODULE} ...` or `sglang serve ...`, got `{shown}`",
            )
        ]
    )


def _int(flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise CommandLineError([(flag, f"must be an integer, got {value!r}")]) from None


def parse_launch(argv: Sequence[str]) -> LaunchLine:
    """The launch command line `argv`, read as described in the module's docstring."""
    program, rest = _program(argv)
    model: str | None = None
    tp, host, port = 1, None, None
    draft: dict[str, str | None] = {}
    kept: list[str] = []
    problems: list[tuple[str, str]] = []
    for flag, value, tokens in _flags(rest):
        if flag in _MODEL:
            model = value
        elif flag == "--host":
            host = value
        elif flag == "--port":
            port = _int(flag, value or "")
        elif flag in _DRAFT:
            draft[flag] = value
        elif flag in _REFUSED:
            problems.append((flag, f"cannot be captured: {_REFUSED[flag]}"))
        elif flag in _ONE and _int(flag, value or "") != 1:
            problems.append((flag, f"must be 1 (got {value}): {_ONE[flag]}"))
        elif flag in _TP:
            tp = _int(flag, value or "")  # the request's tp: the launcher sets --tp-size from it
        else:
            kept += tokens
    if model is None:
        problems.append(("--model-path", "is missing: the command line must name the model"))
    if problems:
        raise CommandLineError(problems)
    if "--speculative-draft-model-revision" in draft and _DRAFT[0] not in draft:
        raise CommandLineError([(_DRAFT[1], f"needs {_DRAFT[0]}")])
    assert model is not None
    return LaunchLine(model, tp, tuple(kept), host, port, program, draft.get(_DRAFT[0]),
                      draft.get(_DRAFT[1]))  # fmt: skip


def notice(line: LaunchLine) -> str:
    """What coldsnap changes in the user's command line, for stderr."""
    text = "the capture serves on 127.0.0.1 at a free port coldsnap picks (--host and --port are "
    text += "coldsnap's)"
    if line.port is not None or line.host is not None:
        where = f"{line.host or '127.0.0.1'}:{line.port or '(the capture port)'}"
        text += f"; restores serve on your {where} unless given --host/--port"
    return text


__all__ = ["MODULE", "CommandLineError", "LaunchLine", "notice", "parse_launch"]
