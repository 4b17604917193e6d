"""`coldsnap logs NAME`: the engine log of what a restore (or a kept capture) left serving, as
`tail` shows a file: the last lines, and with --follow what the engine writes next, until it
stops or the reader interrupts. The log is the one the operation's receipt names (the
`engine_log` fact): the engine's own stdout and stderr, which never go to coldsnap's terminal."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import click

from coldsnap.machine import RequestError

from . import _serving
from ._errors import reported

POLL_SECONDS = 0.25
"""How often --follow looks for more of the log and whether the engine still runs."""
_CHUNK = 64 * 1024


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().obj and ctx.find_root().obj.get("debug"))


def engine_log(workdir: Path) -> Path:
    """The engine log the receipt of the operation in `workdir` names (RequestError naming the
    target when there is no receipt or it names none)."""
    done = _serving.receipt(workdir)
    if done is None:
        raise RequestError([("target", f"{workdir} has no receipt yet (the operation has not "
                             f"ended: coldsnap status {workdir})")])  # fmt: skip
    path = (done.get("facts") or {}).get("engine_log")
    if not isinstance(path, str) or not path:
        raise RequestError([("target", f"the operation in {workdir} names no engine log")])
    return Path(path)


def last_lines(path: Path, count: int) -> tuple[bytes, int]:
    """The last `count` lines of the file at `path` and the offset its end had when read."""
    with path.open("rb") as log:
        end = log.seek(0, os.SEEK_END)
        if count == 0:
            return b"", end
        start, data = end, b""
        while start > 0 and data.count(b"\n") <= count:
            start = max(0, start - _CHUNK)
            log.seek(start)
            data = log.read(end - start)
    lines = data.splitlines(keepends=True)
    return b"".join(lines[-count:]), end


def _write(data: bytes) -> None:
    if data:
        click.echo(data, nl=False)  # bytes go to the binary stream as they are


def follow(path: Path, offset: int, workdir: Path) -> None:
    """Prints what is written to `path` after `offset` until the engine of `workdir` no longer
    runs (what it wrote last is printed first)."""
    with path.open("rb") as log:
        log.seek(offset)
        while True:
            running = _serving.state(workdir)["running"]
            _write(log.read())
            if not running:
                return
            time.sleep(POLL_SECONDS)


@click.command("logs")
@click.argument("target", metavar="NAME|WORKDIR")
@click.option(
    "-n", "--lines", "count", type=click.IntRange(min=0), default=50, show_default=True,
    help="How many of the last lines to print.",
)  # fmt: skip
@click.option(
    "-f", "--follow", "following", is_flag=True,
    help="Keep printing what the engine writes, until it stops (or Ctrl-C).",
)  # fmt: skip
def logs(target: str, count: int, following: bool) -> None:
    """Print the engine log of NAME (a served engine's name, as `coldsnap status` lists it) or of
    the operation in WORKDIR (written as a path)."""
    with reported(_debug):
        workdir, _ = _serving.workdir_of(target)
        path = engine_log(workdir)
        try:
            data, end = last_lines(path, count)
        except OSError as exc:
            raise RequestError([("target", f"cannot read {path}: {exc.strerror}")]) from None
    _write(data)
    if following:
        with contextlib.suppress(KeyboardInterrupt):  # the reader's way to stop following
            follow(path, end, workdir)


__all__ = ["engine_log", "follow", "last_lines", "logs"]
