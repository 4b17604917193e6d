"""Starting a process so that CRIU can snapshot it and restore it many times.

What a snapshot target needs (measured with CRIU on real SGLang trees):
- its own session and no terminal (else CRIU needs --shell-job and restores into our tty);
- stdin from /dev/null and stdout/stderr opened in append mode: with a truncating open, a
  restore fails once the log grew after the dump ("File ... has bad size");
- no stray inherited descriptors (CRIU would have to find each one again at restore);
- io_uring_setup failing with ENOSYS (CRIU cannot dump io_uring; see _seccomp);
- optionally a PID namespace of its own (`unshare --pid --fork`), so several restored copies
  of one image can live at once. Never `--kill-child`: CRIU would save and restore that
  parent-death signal, and the copies would die with their restorer;
- optionally (`hold`) a small root that holds the program as its child: a restore of a tree
  whose own root is large reads that root's memory last and alone (see _launch_child).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from attrs import define, field

from . import procs
from ._errors import LaunchError

_CHILD = Path(__file__).with_name("_launch_child.py")
_HOLD = "--hold"


@define(eq=False)
class Launched:
    """A started target. `pid` is the process to dump (in a new PID namespace, the namespace's
    init as seen from here; with `hold`, the holder, whose only child is the program);
    `launcher` is our direct child: the target itself, or `unshare`."""

    pid: int
    launcher: subprocess.Popen[bytes] = field(repr=False)
    new_pid_namespace: bool
    log_path: Path | None

    def poll(self) -> int | None:
        """The launcher's exit code once it has ended (and is reaped), else None."""
        return self.launcher.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.launcher.wait(timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM to the target, SIGKILL to what is left after `timeout`; reaps the launcher.
        In a PID namespace the kernel ends everything in it when its init (the target) ends."""
        code = procs.stop_tree(self.pid, timeout, signal.SIGTERM)
        try:
            launcher_code = self.launcher.wait(timeout)
        except subprocess.TimeoutExpired:
            self.launcher.kill()
            launcher_code = self.launcher.wait(timeout)
        return launcher_code if code is None else code


def launch(
    argv: Sequence[str],
    *,
    log_path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    new_pid_namespace: bool = False,
    block_io_uring: bool = True,
    hold: bool = False,
    timeout: float = 10.0,
) -> Launched:
    """Starts `argv` as a snapshot target and returns once the program itself runs.

    stdout and stderr go to `log_path` (opened for appending; /dev/null when None). With
    `hold` the target's root is a small process (a few MB) that runs the program as its only
    child, passes on SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2, and exits as the
    program does.
    """
    argv = [os.fspath(a) for a in argv]
    if not argv:
        raise LaunchError("launch: argv is empty")
    if shutil.which(argv[0], path=(env or os.environ).get("PATH")) is None and not os.path.isfile(
        argv[0]
    ):
        raise LaunchError(f"launch: argv[0] {argv[0]!r} is not a program on PATH")
    if cwd is not None and not os.path.isdir(cwd):
        raise LaunchError(f"launch: cwd {os.fspath(cwd)!r} is not a directory")
    child = [sys.executable, "-E", "-s", "-S", str(_CHILD)]
    if block_io_uring:
        child.append("--no-io-uring")
    if hold:
        child.append(_HOLD)
    child += ["--", *argv]
    if new_pid_namespace:
        unshare = shutil.which("unshare")
        if unshare is None:
            raise LaunchError("launch: new_pid_namespace needs util-linux's `unshare`")
        child = [unshare, "--pid", "--fork", *child]
    path = Path(log_path) if log_path is not None else None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    out = open(path, "ab") if path is not None else open(os.devnull, "wb")  # noqa: SIM115
    try:
        popen = subprocess.Popen(
            child,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            close_fds=True,
            # `unshare` gets a session of its own too, away from our terminal's signals.
            start_new_session=new_pid_namespace,
        )
    finally:
        out.close()
    launched = Launched(popen.pid, popen, new_pid_namespace, path)
    try:
        if new_pid_namespace:
            launched.pid = _first_child(popen, timeout)
        _wait_for_exec(launched, timeout, hold)
    except BaseException:
        launched.stop(timeout=2.0)
        raise
    return launched


def _first_child(popen: subprocess.Popen[bytes], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = _children(popen.pid)
        if pids:
            return pids[0]
        if popen.poll() is not None:
            raise LaunchError(f"launch: unshare exited with {popen.returncode} before forking")
        time.sleep(0.002)
    raise LaunchError(f"launch: unshare made no child within {timeout} s")


def _wait_for_exec(launched: Launched, timeout: float, hold: bool = False) -> None:
    """Waits until the helper has replaced itself with the program (with `hold`: until the
    helper's child has)."""
    deadline = time.monotonic() + timeout
    marker = str(_CHILD).encode()
    while time.monotonic() < deadline:
        pids = _children(launched.pid) if hold else [launched.pid]
        for pid in pids:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                cmdline = b""
            if cmdline and marker not in cmdline:
                return
        if launched.poll() is not None or _ended(launched.pid):
            tail = ""
            if launched.log_path is not None and launched.log_path.exists():
                tail = launched.log_path.read_text(errors="replace")[-2000:]
            raise LaunchError(
                f"launch: the target ended at start (launcher exit {launched.poll()})"
                + (f"; log {launched.log_path}:\n{tail}" if tail else "")
            )
        time.sleep(0.002)
    raise LaunchError(f"launch: the program did not start within {timeout} s")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def held_program(pid: int) -> int | None:
    """The program a holder at `pid` runs (its only child), None when `pid` is no holder
    (`launch(..., hold=True)`). Known by the holder's own command line, which a restored image
    keeps: this helper's file name (the restoring host may hold coldsnap elsewhere) and --hold."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    name = b"/" + _CHILD.name.encode()
    if _HOLD.encode() not in argv or not any(a.endswith(name) for a in argv):
        return None
    children = _children(pid)
    return children[0] if len(children) == 1 else None


def _ended(pid: int) -> bool:
    """True when `pid` is gone or a zombie (it may not be our child, so no waitpid here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")
