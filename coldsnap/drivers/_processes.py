"""Process lifetimes shared by the drivers: start under the snapshot-friendly launcher, stop and
reap whole trees, continue trees CRIU left stopped."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path
from typing import Any

from coldsnap.backends import Criu, Launched, become_subreaper, launch, reap_children, stop_tree
from coldsnap.backends.procs import pid_exists, tree_pids
from coldsnap.machine import LaunchCommand, StepContext


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
        self, command: LaunchCommand, log_path: Path, *, new_pid_namespace: bool = False
    ) -> int:
        env = {**os.environ, **command.env}
        launched = launch(
            command.argv,
            log_path=log_path,
            env=env,
            cwd=command.cwd,
            new_pid_namespace=new_pid_namespace,
        )
        self._launched[launched.pid] = launched
        return launched.pid

    def alive(self, pid: int | None) -> bool:
        return pid is not None and pid_exists(pid) and not _zombie(pid)

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

    def resume(self, pid: int) -> None:
        """SIGCONT to every task of a tree CRIU restored stopped."""
        for member in tree_pids(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGCONT)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


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
