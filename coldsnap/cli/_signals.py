"""Ctrl-C and SIGTERM while a command runs an operation: the operation is cancelled, not cut off.

Python's default SIGINT raises KeyboardInterrupt wherever the main thread is (click then prints
"Aborted!" and exits 1) and the default SIGTERM ends the process at once: either leaves the
engine running and the operation half done, its journal open, with no word of what to run.
While an operation runs, `interrupts` takes both signals instead: the first cancels the
operation (the running step stops at its next `check()`, or ends, and the machine compensates
back; the command then exits with the receipt's code and, under `--json`, its `finished`
event). Later signals do not cut the compensation short (that would leave what it is undoing);
each says so, and what to run should the process be killed anyway. Every message names the
exact `coldsnap resume WORKDIR`: an operation stopped by SIGKILL or a power cut is finished by
that command from its journal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from coldsnap.machine import JournalUnwritable

from ._errors import finish, resume_line

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Handler:
    def __init__(self, workdir: str, cancel: threading.Event) -> None:
        self.resume = resume_line(workdir)
        self.cancel = cancel

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not self.cancel.is_set():
            self.cancel.set()
            text = (
                f"coldsnap: {name}: cancelling; the running step ends first, then what this "
                f"operation did is rolled back. If this process is killed before that ends, "
                f"run: {self.resume}"
            )
        else:
            text = (
                f"coldsnap: {name}: already cancelling; the rollback goes on (stopping it now "
                f"would leave what it is undoing). If this process is killed, run: {self.resume}"
            )
        # A signal handler runs between two bytecodes of the main thread, which may be inside a
        # write to sys.stderr: one write(2) of our own never re-enters that buffer.
        os.write(2, (text + "\n").encode())


@contextlib.contextmanager
def interrupts(workdir: str, *, events: bool = False) -> Iterator[threading.Event]:
    """Yields the cancellation event to hand the Machine's operation; SIGINT and SIGTERM set it
    while the block runs (the handlers before are put back after). An operation whose journal
    or receipt could not be written ends the command here: its receipt as `finish` prints it
    (the `finished` event under `events`), with the `coldsnap resume WORKDIR` that records how
    it ended, and exit code 4.

    Signals reach Python's handlers only in the main thread: elsewhere (an embedding program's
    worker) the handlers are the caller's own business and none is installed."""
    cancel = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        handler = _Handler(workdir, cancel)
        for sig in SIGNALS:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield cancel
    except JournalUnwritable as exc:
        if exc.receipt is None:
            raise  # nothing ran: there is nothing to resume
        finish(exc.receipt, events=events, unrecorded=exc)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


__all__ = ["SIGNALS", "interrupts"]
