"""Exit codes and the one-line error of the `coldsnap` command.

0 done; 2 a bad request (the request file, its fields, a workdir without a journal, a workdir
another operation holds); 3 rolled back (nothing left behind); 4 failed with leftovers (a
compensation failed: the receipt names it; or the operation's journal could not be written, or
it was stopped before it ended: the message says to run `coldsnap resume WORKDIR`); 5 the
environment lacks what the operation needs (CRIU, an engine install); 1 any other coldsnap
error. Errors print one line on stderr,
`coldsnap: <what>`, and a traceback only under `--debug`.

The code comes from the error's branch of coldsnap's exception tree (and its
`EnvironmentMissing` mark), on a live exception or on the typed error a receipt keeps
(`Receipt.failure`), never from a class name parsed out of a message.
"""

from __future__ import annotations

import json
import shlex
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NoReturn

import attrs
import click

from coldsnap._errors import ColdsnapError
from coldsnap.machine import (
    JournalError,
    JournalUnwritable,
    Receipt,
    RequestError,
    branch_of,
    environment_missing,
)

OK, OTHER, BAD_REQUEST, ROLLED_BACK, FAILED, ENVIRONMENT_MISSING = 0, 1, 2, 3, 4, 5

BRANCH_CODES = {RequestError.__name__: BAD_REQUEST}
"""Exit codes by branch for an error raised out of a command; every other branch (and an
unexpected error) is OTHER."""


def code_of(exc: BaseException) -> int:
    if isinstance(exc, JournalUnwritable):
        return FAILED  # what the operation did is not all on record: `resume` must finish it
    if environment_missing(exc):
        return ENVIRONMENT_MISSING
    if isinstance(exc, JournalError | json.JSONDecodeError | UnicodeDecodeError):
        return BAD_REQUEST  # a workdir without a journal, or one another operation holds
    return BRANCH_CODES.get(branch_of(exc), OTHER)


def receipt_code(receipt: Receipt) -> int:
    if receipt.outcome == "done":
        return OK
    if receipt.outcome == "failed":
        return FAILED
    if receipt.failure is not None and receipt.failure.environment:
        return ENVIRONMENT_MISSING
    return ROLLED_BACK


def resume_line(workdir: str) -> str:
    """The command that finishes (or rolls back) the operation journaled in `workdir`."""
    return f"coldsnap resume {shlex.quote(workdir)}"


def say(message: str) -> None:
    first = " ".join(message.split())  # one line, whatever the error's message holds
    click.echo(f"coldsnap: {first}", err=True)


def finish(
    receipt: Receipt,
    extra: Mapping[str, Any] | None = None,
    *,
    events: bool = False,
    unrecorded: JournalUnwritable | None = None,
) -> NoReturn:
    """Prints the receipt's summary (with `extra`) as one JSON line on stdout (under `--json`,
    the `finished` event that carries it and the receipt), the error on stderr; exits with its
    code. With `unrecorded` (the operation ended, but its journal or receipt is not all on
    disk), the summary's `resume` is the command that records how it ended, and the code is 4
    whatever the outcome: what the operation did is not all on record until that runs."""
    from ._events import dumps, finished

    failure = receipt.failure
    result = {
        "outcome": receipt.outcome,
        "error": receipt.error,
        "failure": None if failure is None else attrs.asdict(failure),  # typed, for scripts
        "seconds": round(receipt.seconds, 3),
        "workdir": receipt.workdir,
        **(extra or {}),
    }
    if unrecorded is not None:
        result["resume"] = resume_line(receipt.workdir)
    click.echo(dumps(finished(receipt, result)) if events else json.dumps(result))
    if unrecorded is not None:
        say(_describe(unrecorded))
        sys.exit(FAILED)
    code = receipt_code(receipt)
    if code:
        say(f"{receipt.outcome}: {receipt.error} (receipt in {receipt.workdir})")
    sys.exit(code)


@contextmanager
def reported(debug: Callable[[], bool]) -> Iterator[None]:
    """Turns an error into its one line and exit code (with the traceback under --debug)."""
    try:
        yield
    except (ColdsnapError, OSError, ValueError, ImportError) as exc:
        if debug():
            traceback.print_exc(file=sys.stderr)
        say(_describe(exc))
        sys.exit(code_of(exc))


def _describe(exc: BaseException) -> str:
    from ._cmdline import CommandLineError

    if isinstance(exc, CommandLineError):
        return "cannot capture this command line: " + "; ".join(
            f"{flag} {why}" for flag, why in exc.problems
        )
    if isinstance(exc, RequestError):
        return "bad request: " + "; ".join(f"field '{f}': {m}" for f, m in exc.problems)
    if isinstance(exc, JournalUnwritable) and exc.receipt is not None:
        return f"{exc}; once it has room, run: {resume_line(exc.receipt.workdir)}"
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, ColdsnapError) else f"{type(exc).__name__}: {text}"


__all__ = ["code_of", "finish", "receipt_code", "reported", "resume_line", "say"]
