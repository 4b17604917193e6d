"""What serves after a `coldsnap restore`, so that `stop` and `status` find it by name.

The restore's workdir is the truth: its receipt holds the engine's PID, URL and runtime dir, its
journal what the operation did. A serving record (`SERVING_DIR/NAME.json`, written by the
command line once a restore is done) only maps a name to that workdir. SERVING_DIR is on a
tmpfs (/run) by default: after a reboot nothing serves, and no record says otherwise.

An engine is identified by its runtime dir, which is in every one of its processes' environment
(CRIU restores the environment as it was): a PID that another process took since is never
signalled.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from attrs import asdict, frozen

from coldsnap._atomic import write_json_atomic
from coldsnap._errors import OperationError
from coldsnap._paths import SERVING_ROOT
from coldsnap.backends.procs import running
from coldsnap.machine import (
    JOURNAL_NAME,
    JournalError,
    Receipt,
    Replay,
    RequestError,
    StepEvent,
    read_journal,
)
from coldsnap.machine._receipt import RECEIPT_NAME

from . import _sleep

SERVING_ENV = "COLDSNAP_SERVING_DIR"
DEFAULT_SERVING_DIR = SERVING_ROOT
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ServingError(OperationError):
    """An engine could not be found or stopped as asked."""


def serving_dir() -> Path:
    return Path(os.environ.get(SERVING_ENV) or DEFAULT_SERVING_DIR)


@frozen(kw_only=True)
class Serving:
    """A name for a restored engine, and the restore's workdir that knows the rest."""

    name: str
    workdir: str
    artifact: str
    capsule_digest: str | None
    url: str | None
    pid: int | None
    started: float
    format: int = 1
    kind: str = "coldsnap.serving"


def record(serving: Serving) -> Path:
    return write_json_atomic(serving_dir() / f"{serving.name}.json", asdict(serving))


def _read_record(path: Path) -> Serving | None:
    try:
        data = json.loads(path.read_text())
        return Serving(**{k: data[k] for k in data if k not in ("format", "kind")})
    except (OSError, ValueError, TypeError, KeyError):
        return None


def records() -> list[Serving]:
    folder = serving_dir()
    if not folder.is_dir():
        return []
    found = (_read_record(p) for p in sorted(folder.glob("*.json")))
    return [s for s in found if s is not None]


def forget(workdir: Path) -> None:
    """Removes every serving record that names `workdir`."""
    for serving in records():
        if Path(serving.workdir) == workdir:
            (serving_dir() / f"{serving.name}.json").unlink(missing_ok=True)


def workdir_of(target: str) -> tuple[Path, str | None]:
    """The workdir `target` names, and the name: a name (a serving record's) unless `target` is
    plainly a path by its spelling (a '/' or a leading '.'); never a folder of the current
    directory that happens to be named like the engine (another user may have put it there)."""
    if _NAME.match(target):
        serving = _read_record(serving_dir() / f"{target}.json")
        if serving is not None:
            return Path(serving.workdir), serving.name
        where = f"neither a name serving here ({serving_dir()}) nor a workdir (write one as a path"
        raise RequestError([("target", f"{target!r} is {where}: ./{target})")])
    if Path(target).is_dir():
        return Path(target).resolve(), None
    raise RequestError(
        [("target", f"{target!r} is neither a name serving here ({serving_dir()}) nor a workdir")]
    )


def receipt(workdir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((workdir / RECEIPT_NAME).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise JournalError(f"{workdir / RECEIPT_NAME}: not a receipt ({exc})") from None
    return data if isinstance(data, dict) else None


def engine_alive(pid: int | None, runtime_dir: str | None) -> bool:
    """Whether `pid` runs and is the engine of `runtime_dir` (not a later process that took
    the PID). Without a runtime dir to compare, a live non-zombie PID counts."""
    return running(pid, environ=("COLDSNAP_RUNTIME_DIR", runtime_dir) if runtime_dir else None)


def listening(url: str | None) -> bool:
    if not url:
        return False
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), 0.5):
            return True
    except OSError:
        return False


def state(workdir: Path) -> dict[str, Any]:
    """What `status` says of one workdir: the operation, how it ended (or where it is), and
    whether its engine runs and listens."""
    out: dict[str, Any] = {"workdir": str(workdir)}
    journal = workdir / JOURNAL_NAME
    if journal.exists():
        replay = Replay.of(read_journal(journal))
        out["operation"] = replay.request.get("kind", "").removeprefix("coldsnap.")
        out["operation"] = out["operation"].removesuffix("-request") or None
        out["spec"] = replay.spec
        if replay.end is not None:
            out["state"] = replay.end.outcome
        elif replay.compensating:
            out["state"] = "compensating"
        else:
            out["state"] = f"running step {replay.interrupted}" if replay.interrupted else "running"
        out["artifact"] = replay.request.get("artifact") or replay.request.get("name")
    else:
        out["state"] = "no journal"
    done = receipt(workdir) or {}
    facts = done.get("facts") or {}
    pid, url, runtime = facts.get("engine_pid"), facts.get("engine_url"), facts.get("runtime_dir")
    out["pid"], out["url"] = pid, url
    out["capsule_digest"] = facts.get("capsule_digest")
    out["running"] = engine_alive(pid, runtime)
    out["listening"] = out["running"] and listening(url)
    ops = _sleep.operations(workdir)
    out["sleep"] = _sleep.sleep_state(ops)
    out["stopped"] = _sleep.stopped(ops)
    pending = next((op for op in reversed(ops) if op.outcome is None), None)
    out["pending"] = None if pending is None else str(pending.workdir)
    return out


def stop(workdir: Path, subscribers: Iterable[Callable[[StepEvent], None]] = ()) -> Receipt:
    """Stops the engine a restore in `workdir` left serving through the Machine (the driver's
    stop spec: its whole process tree, its runtime dir and what the driver left beside it, the
    capsule's files laid out in the workdir); once that is done, forgets the serving records
    naming the workdir. The workdir (journal, receipt, logs) stays."""
    receipt = _sleep.run("stop", workdir, subscribers)
    if receipt.ok:
        forget(workdir)
    return receipt


__all__ = [
    "DEFAULT_SERVING_DIR",
    "SERVING_ENV",
    "Serving",
    "ServingError",
    "engine_alive",
    "forget",
    "record",
    "records",
    "serving_dir",
    "state",
    "stop",
    "workdir_of",
]
