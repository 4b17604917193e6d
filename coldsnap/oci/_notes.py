"""What a push or pull tells its caller as it runs: each step's start and end (done, skipped
with why, failed with the error) and, while bytes move, how many of how many. The command line
turns these into the step lines and `--json` events capture and restore print."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from attrs import frozen


@frozen
class Note:
    """One thing a push or pull did: `phase` is started, done, skipped, failed or progress."""

    operation: str
    step: str
    phase: str
    seconds: float = 0.0
    detail: str = ""
    facts: dict[str, Any] | None = None


Notify = Callable[[Note], None]


class Said:
    """What a running step says of itself: `done(text)` adds to what its end shows,
    `skip(why)` makes it end as skipped (it found nothing to do), saying why."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.skipped: str | None = None

    def done(self, text: str) -> None:
        self.lines.append(text)

    def skip(self, why: str) -> None:
        self.skipped = why


class Steps:
    """Emits the notes of one operation's steps; safe to call from the threads that move
    blobs (notes are delivered one at a time)."""

    def __init__(self, operation: str, notify: Notify, *, every_s: float = 0.5) -> None:
        self.operation = operation
        self._notify = notify
        self._lock = threading.Lock()
        self._every_s = every_s

    def note(self, step: str, phase: str, **kw: Any) -> None:
        with self._lock:
            self._notify(Note(self.operation, step, phase, **kw))

    @contextmanager
    def step(self, name: str) -> Iterator[Said]:
        """Runs a step: started, then done (with what the body said), skipped (the body said
        why) or failed (any error, raised on)."""
        began = time.monotonic()
        said = Said()
        self.note(name, "started")
        try:
            yield said
        except BaseException as exc:
            self.note(name, "failed", seconds=time.monotonic() - began, detail=str(exc))
            raise
        seconds = time.monotonic() - began
        if said.skipped is not None:
            self.note(name, "skipped", seconds=seconds, detail=said.skipped)
        else:
            self.note(name, "done", seconds=seconds, detail="; ".join(said.lines))

    def meter(self, step: str, total: int) -> Callable[[int], None]:
        """A callable told the bytes of each piece moved; it notes the running count at most
        every `every_s` seconds, and at the end."""
        done, last = [0], [0.0]
        lock = threading.Lock()

        def moved(n: int) -> None:
            with lock:
                done[0] += n
                now = time.monotonic()
                if done[0] < total and now - last[0] < self._every_s:
                    return
                last[0], count = now, done[0]
            self.note(step, "progress", detail=f"{_mib(count)} of {_mib(total)}",
                      facts={"bytes": count, "of": total})  # fmt: skip

        return moved


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


__all__ = ["Note", "Notify", "Said", "Steps"]
