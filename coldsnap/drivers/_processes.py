"""Process lifetimes shared by the drivers: start under the snapshot-friendly launcher, stop and
reap whole trees, continue trees CRIU left stopped, and find what an orchestrator that died
between a spawn and its journal record left running.

What the drivers leave on the host besides processes is removed with them: an engine's runtime
dir and a template's control dir (both under HOST_ROOT), and CRIU's restore work dir in the
workdir (its log is kept beside it)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from coldsnap._paths import HOST_RUN
from coldsnap.backends import (
    RESTORED_PIDFILE,
    Criu,
    Launched,
    become_subreaper,
    launch,
    reap_children,
    stop_tree,
)
from coldsnap.backends.procs import pid_exists, running, start_stamp, tree_pids
from coldsnap.machine import LaunchCommand, LifecycleRequest, StepContext

from ._facts import ENGINE_START

HOST_ROOT = HOST_RUN
"""Where engines' runtime dirs and templates' control dirs live: the only place outside the
workdir from which a driver removes directories."""
RUNTIME_ENV = "COLDSNAP_RUNTIME_DIR"
"""The variable naming an engine's runtime dir: unique per launched engine, kept by CRIU."""
RESTORE_WORK = "criu-restore"
"""CRIU's restore work dir in the workdir: its log, the restored root's pidfile, its record."""


class Processes:
    """Tracks what a driver started or restored, so it can stop and reap all of it.

    The driver makes itself a child subreaper, so that trees CRIU restores detached are adopted
    by this process and reaped here rather than left as zombies holding their PIDs.
    """

    def __init__(self) -> None:
        self._launched: dict[int, Launched] = {}
        with contextlib.suppress(OSError):
            become_subreaper()

    def start(
        self,
        command: LaunchCommand,
        log_path: Path,
        *,
        new_pid_namespace: bool = False,
        hold: bool = False,
    ) -> int:
        """Starts the command; returns the root of its tree (with `hold`, a small holder whose
        child is the command: see coldsnap.backends.launch)."""
        env = {**os.environ, **command.env}
        launched = launch(
            command.argv,
            log_path=log_path,
            env=env,
            cwd=command.cwd,
            new_pid_namespace=new_pid_namespace,
            hold=hold,
        )
        self._launched[launched.pid] = launched
        return launched.pid

    def alive(self, pid: int | None) -> bool:
        return running(pid)

    def stop(self, pid: int | None, timeout: float = 20.0) -> None:
        """SIGTERM to the root only (SGLang's launcher then stops its children), SIGKILL to what
        is left after `timeout`; reaps everything that is ours. Idempotent."""
        if pid is None:
            return
        launched = self._launched.pop(pid, None)
        if launched is not None:
            launched.stop(timeout)
        elif pid_exists(pid):
            stop_tree(pid, timeout)
        reap_children()

    def stop_strays(self, pids: list[int], timeout: float = 5.0) -> None:
        """Stops trees that no journal record names (see `find_roots`, `restored_root`)."""
        for pid in pids:
            stop_tree(pid, timeout)
        reap_children()

    def resume(self, pid: int) -> None:
        """SIGCONT to every task of a tree CRIU restored stopped."""
        for member in tree_pids(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGCONT)


Belongs = Callable[[psutil.Process], bool]
"""Whether a live process is the one a driver looks for (raises psutil.Error when unreadable)."""


def env_is(name: str, value: str | None) -> Belongs:
    """A process whose initial environment sets `name` to `value` (CRIU keeps it)."""
    return lambda proc: bool(value) and proc.environ().get(name) == value


def has_arg(value: str | None) -> Belongs:
    """A process with `value` among its command-line arguments."""
    return lambda proc: bool(value) and value in proc.cmdline()[1:]


def find_roots(belongs: Belongs) -> list[int]:
    """Roots of the live process trees that `belongs`: what a spawn left when its orchestrator
    died before the PID was journaled. A tree's members match alike; only its root is returned.
    """
    found: dict[int, int] = {}
    for proc in psutil.process_iter(["pid", "ppid", "status"]):
        if proc.info["pid"] == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if belongs(proc):
                found[proc.info["pid"]] = proc.info["ppid"]
        except (psutil.Error, OSError):
            continue
    return sorted(pid for pid, parent in found.items() if parent not in found)


RESTORE_WAIT_S = 120.0
"""How long a search for an unjournaled restored root waits for a CRIU restore still running."""


def _restores_writing(pidfile: Path) -> list[psutil.Process]:
    """The CRIU restores still running that will write `pidfile` (their command line names it)."""
    want = str(pidfile.resolve())
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        args = proc.info.get("cmdline") or []
        if "restore" in args and want in args:
            found.append(proc)
    return found


def restored_root(workdir: Path, belongs: Belongs) -> int | None:
    """The root CRIU restored for this operation (its pidfile in the restore work dir), when
    it still runs and `belongs`: a restore whose orchestrator died before the PID was
    journaled. A pidfile may outlive its process and the PID be taken by another: hence the
    check. CRIU writes the pidfile only once the tree is restored, and a restore outlives the
    orchestrator that was killed while it ran: so a restore still running for this operation
    is waited for first (at most RESTORE_WAIT_S), or its tree would be missed and left running."""
    pidfile = workdir / RESTORE_WORK / RESTORED_PIDFILE
    psutil.wait_procs(_restores_writing(pidfile), timeout=RESTORE_WAIT_S)
    try:
        pid = int(pidfile.read_text().strip())
        proc = psutil.Process(pid)
        ours = proc.status() != psutil.STATUS_ZOMBIE and belongs(proc)
    except (OSError, ValueError, psutil.Error):
        return None
    return pid if ours else None


def operation_dir(ctx: StepContext) -> Path:
    """The workdir of the operation that started or restored the processes a step acts on:
    for a stop (or another lifecycle operation) its target's, where CRIU's restore work dir
    lies; otherwise the step's own."""
    if isinstance(ctx.request, LifecycleRequest):
        return Path(ctx.request.target)
    return ctx.workdir


def still_ours(ctx: StepContext, pid: int | None, belongs: Belongs) -> int | None:
    """`pid` when it may be signalled: always within the operation that started it; for a
    lifecycle operation (a stop long after the restore) only while the process still
    `belongs` to that engine and, where the target recorded one, has the engine's start
    stamp (ENGINE_START, declared by the stop's step): its PID may have been taken since
    by another process, and a replica restored from the same image has the same PID and
    environment. A target recorded before stamps were is judged by `belongs` alone."""
    if pid is None or not isinstance(ctx.request, LifecycleRequest):
        return pid
    stamp = None
    if ctx.request.operation == "stop":  # the one lifecycle operation with a driver's step
        stamp = ctx.facts.get("engine_start")
    if stamp is not None and start_stamp(pid) != stamp:
        return None
    try:
        return pid if belongs(psutil.Process(pid)) else None
    except (psutil.Error, OSError):
        return None


def engine_stamp(pid: int | None) -> dict[str, Any]:
    """The ENGINE_START fact of the process just spawned or restored as `pid`."""
    return {ENGINE_START.name: start_stamp(pid)}


def runtime_dirs_of(pid: int | None) -> set[str]:
    """The runtime dir in the initial environment of `pid` (an n580 template's differs from the
    one its engine gets at release): removed with the process."""
    if pid is None:
        return set()
    try:
        value = psutil.Process(pid).environ().get(RUNTIME_ENV)
    except (psutil.Error, OSError):
        return set()
    return {value} if value else set()


def discard_host_dirs(*paths: str | None) -> None:
    """`discard_host_dir` for each path."""
    for path in paths:
        discard_host_dir(path)


def discard_unused(path: str | None, belongs: Belongs) -> None:
    """`discard_host_dir`, unless a live process still `belongs` to the directory: a replica
    restored from the same image has the same runtime dir (and an n580 template the same
    control dir), and what one replica's stop or failed restore leaves must not be taken from
    another that serves."""
    if path and not find_roots(belongs):
        discard_host_dir(path)


def host_dir_to_make(path: str | None) -> bool:
    """Whether an engine's runtime dir is one to make: strictly below HOST_ROOT (the path comes
    from a capsule's facts, so nothing is made anywhere else) and not there yet (one that is
    belongs to whoever made it: another replica). Asked, and its answer journaled, before
    `make_host_dir`, so that an orchestrator killed in between leaves no dir unaccounted."""
    if not path:
        return False
    target = Path(path)
    if not target.is_absolute() or ".." in target.parts or HOST_ROOT not in target.parents:
        return False
    return not os.path.lexists(target)


def make_host_dir(path: str) -> None:
    """Makes an engine's runtime dir (mode 0700) that `host_dir_to_make` said to make; a retry
    finds it made."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    target.mkdir(mode=0o700, exist_ok=True)


def discard_host_dir(path: str | None) -> None:
    """Removes an engine's runtime dir or a template's control dir. Only a directory strictly
    below HOST_ROOT is removed (the path may come from a capsule's facts): anything else, a
    symlink included, is left alone."""
    if not path:
        return
    target = Path(path)
    if not target.is_absolute() or ".." in target.parts or target.is_symlink():
        return
    if HOST_ROOT not in target.parents or not target.is_dir():
        return
    shutil.rmtree(target, ignore_errors=True)


def discard_restore_work(workdir: Path) -> None:
    """Removes CRIU's restore work dir from the workdir, keeping its log beside it
    (`criu-restore.log`): after a failed restore the log is what says why."""
    work = workdir / RESTORE_WORK
    log = work / "restore.log"
    if log.exists():
        os.replace(log, workdir / f"{RESTORE_WORK}.log")
    shutil.rmtree(work, ignore_errors=True)


def discard_images(images: Path) -> None:
    """Removes a dump's images but keeps CRIU's log beside them (`<images>.dump.log`): after a
    failed dump the log is what says why."""
    log = images / "dump.log"
    if log.exists():
        os.replace(log, images.with_name(images.name + ".dump.log"))
    shutil.rmtree(images, ignore_errors=True)


def dump_live(criu: Criu, pid: int, images: Path, ctx: StepContext) -> dict[str, Any]:
    """Dumps a tree and leaves it running, so the steps before the seal can still be undone."""
    manifest = criu.dump(pid, images, leave_running=True, timeout=ctx.remaining())
    return {
        "image_dir": str(images),
        "image_bytes": manifest.image_bytes,
        "dump_seconds": manifest.seconds,
    }
