"""What an operator sees while a capture or restore runs: the running step and its elapsed
seconds while it runs (rich's spinner on a terminal; elsewhere, a line every `every_s` seconds
of a long step, so a log shows a 600 s health wait as it happens), then one line per step as it
ends. Everything comes from the machine's step events (coldsnap.machine.StepEvent)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

import click

from coldsnap.machine import StepEvent

if TYPE_CHECKING:
    from rich.status import Status

ENDED = ("done", "skipped", "failed", "compensated", "compensation_failed")
"""The phases after which a step (or its compensation) has ended."""


def step_line(event: StepEvent) -> str:
    """One ended step, as the command prints it."""
    detail = f"  ({event.detail})" if event.detail else ""
    return f"  {event.spec:<13} {event.step:<20} {event.phase:<20} {event.seconds:7.3f} s{detail}"


class LiveSteps:
    """A step-event subscriber that shows the running step as it runs; a context manager that
    stops the display (and its thread) on exit."""

    def __init__(
        self,
        *,
        stream: TextIO | None = None,
        every_s: float = 15.0,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` gives the seconds the elapsed times are counted in (tests hand their own)."""
        # rich is imported here, not with the module: a command that prints JSON events (the
        # operator's scripted restore) never shows the display and need not pay its import.
        from rich.console import Console

        self._clock = clock
        self._stream = stream or sys.stderr
        self._console = Console(file=self._stream, stderr=stream is None)
        self._live = self._console.is_terminal if live is None else live
        self._every_s = every_s
        self._lock = threading.Lock()
        self._running: tuple[str, str, float] | None = None  # (step, what, started)
        self._latest = ""  # what the running step last recorded
        self._status: Status | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> LiveSteps:
        if not self._live:
            self._ticker = threading.Thread(
                target=self._tick, name="coldsnap:progress", daemon=True
            )
            self._ticker.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        with self._lock:
            self._end_display()
        if self._ticker is not None:
            self._ticker.join(timeout=2.0)

    def __call__(self, event: StepEvent) -> None:
        with self._lock:
            if event.phase in ("started", "compensating"):
                what = "compensating" if event.phase == "compensating" else "running"
                self._running, self._latest = (event.step, what, self._clock()), ""
                if self._live:
                    self._end_display()
                    self._status = self._console.status(_Elapsed(self), spinner="dots")
                    self._status.start()
            elif event.phase == "progress" and self._running is not None:
                self._latest = event.detail  # shown with the running step, never a line of its own
            elif event.phase in ENDED:
                self._running = None
                self._end_display()
                click.echo(step_line(event))

    def text(self) -> str:
        """The running step and its elapsed seconds ('' between steps)."""
        running = self._running
        if running is None:
            return ""
        step, what, started = running
        latest = f": {self._latest}" if self._latest else ""
        return f"{step} {what} ({self._clock() - started:.0f} s){latest}"

    def _end_display(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def tick(self) -> None:
        """Away from a terminal: one line saying which step runs and for how long (nothing
        between steps); the display's thread calls it every `every_s` seconds."""
        with self._lock:
            if self._running is not None:
                print(f"  ... {self.text()}", file=self._stream, flush=True)

    def _tick(self) -> None:
        while not self._stop.wait(self._every_s):
            self.tick()


class _Elapsed:
    """The spinner's text, rendered afresh at each frame so its seconds count up."""

    def __init__(self, display: LiveSteps) -> None:
        self._display = display

    def __rich__(self) -> str:
        return self._display.text()


__all__ = ["ENDED", "LiveSteps", "step_line"]
