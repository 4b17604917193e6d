"""What serves after a `coldsnap restore`, so that `stop` and `status` find it by name.

The restore's workdir is the truth: its receipt holds the engine's PID, URL and runtime dir, its
journal what the operation did. A serving record (`SERVING_DIR/NAME.json`) only maps a name to
that workdir: a restore takes the name before it starts (`taking`, under the name's lock, so two
restores never both get it) and settles it from its receipt when it ends, or `coldsnap resume`
does once it finishes one (`after_resume`). SERVING_DIR is on a tmpfs (/run) by default: after
a reboot nothing serves, and no record says otherwise.

An engine is identified by its PID, its runtime dir (in every one of its processes'
environment) and its start stamp (the restored root's boot id and start time, in the receipt):
CRIU restores PIDs and environment as they were, so a replica restored from the same capsule
after this one ended has the first two, never the third. A PID that another process took since
is never signalled, nor counted as running.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import filelock
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
    Request,
    RequestError,
    RestoreRequest,
    StepEvent,
    StopRequest,
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


def engine_alive(pid: int | None, runtime_dir: str | None, started: str | None = None) -> bool:
    """Whether `pid` runs and is the engine of `runtime_dir` that started at `started` (not a
    later process that took the PID, a replica of the same capsule included). Without a
    runtime dir or a stamp to compare (a receipt written before stamps were), what is there
    is compared."""
    environ = ("COLDSNAP_RUNTIME_DIR", runtime_dir) if runtime_dir else None
    return running(pid, environ=environ, started=started)


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
    # A replica's processes name the capsule's runtime dir (they see their own one there).
    seen_as = facts.get("runtime_dir_as") or runtime
    out["running"] = engine_alive(pid, seen_as, facts.get("engine_start"))
    out["listening"] = out["running"] and listening(url)
    ops = _sleep.operations(workdir)
    out["sleep"] = _sleep.sleep_state(ops)
    out["stopped"] = _sleep.stopped(ops)
    pending = next((op for op in reversed(ops) if op.outcome is None), None)
    out["pending"] = None if pending is None else str(pending.workdir)
    return out


# -- names taken for a restore ------------------------------------------------------------------


def default_name(artifact: str) -> str:
    """The name a restore serves under when none is given: the capsule's tag, or the first 12
    hex digits of its digest."""
    return artifact.removeprefix("sha256:")[:12] if artifact.startswith("sha256:") else artifact


@contextlib.contextmanager
def _name_lock(name: str, *, wait: float = 0.0) -> Iterator[None]:
    """Holds `SERVING_DIR/NAME.lock`: whoever holds it alone reads, takes or settles the
    name's record (a check and a write that others could interleave otherwise)."""
    folder = serving_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = filelock.FileLock(
        folder / f"{name}.lock", timeout=wait, thread_local=False, is_singleton=False
    )
    try:
        lock.acquire()
    except filelock.Timeout:
        raise RequestError(
            [("--serve-as", f"{name!r} is being taken by another restore right now: pick "
              "another --serve-as")]
        ) from None  # fmt: skip
    try:
        yield
    finally:
        lock.release()


def _held(name: str) -> str | None:
    """Why `name` is not free (with the name's lock held), or None: its record names an engine
    that runs, or a restore that did not end (its orchestrator died: `coldsnap resume` finishes
    it, and that restore keeps the name)."""
    held = _read_record(serving_dir() / f"{name}.json")
    if held is None:
        return None
    now = state(Path(held.workdir))
    if now["running"]:
        return f"{name!r} already serves at {now['url']} (pid {now['pid']}; stop it)"
    if now["state"] == "compensating" or now["state"].startswith("running"):
        return (
            f"{name!r} is taken by the restore in {held.workdir}, which did not end (finish it "
            f"with `coldsnap resume {held.workdir}`)"
        )
    return None


def _settle(name: str, workdir: Path, artifact: str) -> bool:
    """Records the engine of the restore in `workdir` under `name` once that restore is done,
    and releases the name when it ended otherwise or never began; a restore that began and
    has no receipt yet keeps the name for `coldsnap resume`. Whether the name now serves."""
    done = receipt(workdir)
    if done is None and (workdir / JOURNAL_NAME).exists():
        return False
    if done is None or done.get("outcome") != "done":
        current = _read_record(serving_dir() / f"{name}.json")
        if current is not None and Path(current.workdir) == workdir:
            (serving_dir() / f"{name}.json").unlink()
        return False
    facts = done.get("facts") or {}
    record(
        Serving(
            name=name,
            workdir=str(workdir),
            artifact=artifact,
            capsule_digest=facts.get("capsule_digest"),
            url=facts.get("engine_url"),
            pid=facts.get("engine_pid"),
            started=time.time(),
        )
    )
    return True


@contextlib.contextmanager
def taking(name: str, workdir: Path, artifact: str) -> Iterator[None]:
    """Takes `name` for the restore that runs in `workdir` during the `with` block, atomically:
    the name's lock is held throughout, so a second restore under the same name at once is
    refused (RequestError naming --serve-as), as is a name whose record names an engine that
    runs or a restore that did not end. The record is written first, naming the workdir (so a
    restore whose orchestrator dies keeps its name, and `coldsnap resume` finds it); on the
    way out it is settled from the workdir's receipt."""
    workdir = workdir.resolve()
    earlier = (workdir / JOURNAL_NAME).exists()  # the Machine refuses it: not this restore's
    with _name_lock(name):
        held = _held(name)
        if held is not None:
            raise RequestError([("--serve-as", f"{held}, or pick another --serve-as")])
        record(Serving(name=name, workdir=str(workdir), artifact=artifact, capsule_digest=None,
                       url=None, pid=None, started=time.time()))  # fmt: skip
        try:
            yield
        finally:
            if earlier:  # what the workdir holds is another operation's: never named here
                (serving_dir() / f"{name}.json").unlink()
            else:
                _settle(name, workdir, artifact)


def after_resume(request: Request, workdir: Path) -> str | None:
    """What `coldsnap stop` and `coldsnap restore` do once their operation ends, for one that
    `coldsnap resume` finished in `workdir`: a stop done forgets its target's records; a
    restore settles the name it took (recorded with its engine when done, released when not).
    A restore whose record is gone (SERVING_DIR is on a tmpfs) takes its default name, unless
    another engine has it. Returns the name a restore now serves under."""
    if isinstance(request, StopRequest):
        if (receipt(workdir) or {}).get("outcome") == "done":
            forget(Path(request.target))
        return None
    if not isinstance(request, RestoreRequest):
        return None
    workdir = workdir.resolve()
    named = next((s.name for s in records() if Path(s.workdir) == workdir), None)
    if named is None and (receipt(workdir) or {}).get("outcome") != "done":
        return None  # no name taken, none to take
    name = named or default_name(request.artifact)
    with _name_lock(name, wait=30.0):
        if named is None:
            held = _held(name)
            if held is not None:
                raise ServingError(
                    f"the restore in {workdir} could not take its name: {held}; it is not "
                    f"recorded as serving (`coldsnap status {workdir}`, `coldsnap stop {workdir}`)"
                )
        return name if _settle(name, workdir, request.artifact) else None


def stop(workdir: Path, subscribers: Iterable[Callable[[StepEvent], None]] = ()) -> Receipt:
    """Stops the engine a restore in `workdir` left serving through the Machine (the driver's
    stop spec: its whole process tree, its runtime dir and what the driver left beside it, the
    capsule's files laid out in the workdir); once that is done and its engine no longer runs
    (its PID with its runtime dir and start stamp), forgets the serving records naming the
    workdir: a record is dropped only once nothing of it serves. The workdir (journal,
    receipt, logs) stays."""
    receipt = _sleep.run("stop", workdir, subscribers)
    if receipt.ok:
        after = state(workdir)
        if after["running"]:
            raise ServingError(
                f"the stop of {workdir} ended, but its engine (pid {after['pid']}, "
                f"{after['url']}) still runs; its serving record is kept"
            )
        forget(workdir)
    return receipt


__all__ = [
    "DEFAULT_SERVING_DIR",
    "SERVING_ENV",
    "Serving",
    "ServingError",
    "after_resume",
    "default_name",
    "engine_alive",
    "forget",
    "record",
    "records",
    "serving_dir",
    "state",
    "stop",
    "taking",
    "workdir_of",
]
