"""CRIU as a backend: dump a process tree to an image directory, restore it, many times.

Driven through the `criu` command line with subprocess, not CRIU's RPC: the
CLI is the simplest interface and is safe to call from a multithreaded controller (nothing
forks our process); pycriu, the RPC's Python side, is not on PyPI, and `criu service` rejects
options a restore may need. Each call gets CRIU's full log (-v4) in its directory.

The defaults are what a real SGLang tree needs (docs/criu.md):
`--tcp-established` (TCPStore's loopback connection), `--network-lock skip` (no iptables/nft
here; safe when both ends are inside the frozen tree), `--link-remap` (deleted POSIX semaphore
files) and `--file-locks` (the scheduler flocks a /dev/shm file now and then), on dump and
restore alike. Files outside the image that a restore needs are kept with it (_files), and
the tree's output can be re-pointed at restore (`output`, CRIU's --inherit-fd), so a restore
needs nothing from the directory the tree was dumped in.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import filelock
from attrs import frozen

from . import _files, procs
from ._errors import BackendArgumentError, CriuError, CriuUnavailable
from ._images import ImageFormatError, TaskIds, read_pstree
from ._log import first_error, first_error_in
from ._records import (
    DUMP_MANIFEST,
    RESTORE_RECORD,
    DumpManifest,
    RestoredTree,
    SavedFile,
    read_record,
    write_record,
)
from ._stdio import read_stdio_paths

MINIMUM_VERSION = (4, 2)
DEFAULT_BINARIES = ("/usr/local/sbin/criu",)
_NS_CHILD = Path(__file__).with_name("_ns_child.py")
DUMP_LOG = "dump.log"
RESTORE_LOG = "restore.log"
# One CRIU dump or restore at a time on a host: both make or put back files at shared paths
# (/dev/shm/link_remap.N) while CRIU runs.
_CRIU_LOCK = Path(tempfile.gettempdir()) / "coldsnap-criu.lock"
RESTORED_PIDFILE = "restored.pid"
"""The pidfile a restore writes in its work dir when none is named: a caller that named the
work dir finds the restored root there (a restore whose orchestrator died before journaling it)."""


@frozen(order=True)
class CriuVersion:
    major: int
    minor: int
    sublevel: int = 0

    @classmethod
    def parse(cls, text: str) -> CriuVersion:
        match = re.search(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", text)
        if not match:
            raise ImageFormatError(f"no 'Version: X.Y' in {text!r}")
        return cls(int(match[1]), int(match[2]), int(match[3] or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.sublevel}"


def find_binary(binary: str | os.PathLike[str] | None = None) -> Path | None:
    """The CRIU to use: `binary`, else $COLDSNAP_CRIU, else /usr/local/sbin/criu (what
    scripts/setup-criu.sh installs), else `criu` on PATH."""
    explicit = binary if binary is not None else os.environ.get("COLDSNAP_CRIU") or None
    if explicit is not None:
        return Path(explicit)  # asked for: never swapped for another; version() says if bad
    for candidate in DEFAULT_BINARIES:
        if os.access(candidate, os.X_OK) and Path(candidate).is_file():
            return Path(candidate)
    found = shutil.which("criu")
    return Path(found) if found else None


class Criu:
    """One CRIU binary. Calls refuse (CriuUnavailable) unless it is at least MINIMUM_VERSION:
    older CRIUs fail on these kernels, and none is ever picked silently instead."""

    def __init__(
        self,
        binary: str | os.PathLike[str] | None = None,
        *,
        minimum: tuple[int, int] = MINIMUM_VERSION,
        log_level: int = 4,
    ) -> None:
        self.binary = find_binary(binary)
        self.minimum = minimum
        self.log_level = log_level
        self._version: CriuVersion | None = None
        self._attached: dict[int, subprocess.Popen[bytes]] = {}

    def __repr__(self) -> str:
        return f"Criu({str(self.binary)!r})"

    # -- what is there -------------------------------------------------------------------

    def version(self) -> CriuVersion:
        if self._version is None:
            if self.binary is None:
                raise CriuUnavailable("version", "no criu binary found; run scripts/setup-criu.sh")
            try:
                out = subprocess.run(
                    [str(self.binary), "--version"], capture_output=True, text=True, timeout=30
                )
            except OSError as exc:
                raise CriuUnavailable("version", f"cannot run {self.binary}: {exc}") from None
            try:
                self._version = CriuVersion.parse(out.stdout)
            except ValueError:
                raise CriuUnavailable(
                    "version", f"{self.binary} --version said {out.stdout + out.stderr!r}"
                ) from None
        return self._version

    def check(self) -> str:
        """Runs `criu check`; returns its verdict or raises CriuUnavailable with the reason."""
        self.require_version()
        out = subprocess.run(
            [str(self.binary), "check"], capture_output=True, text=True, timeout=60
        )
        text = (out.stdout + out.stderr).strip()
        if out.returncode != 0:
            raise CriuUnavailable(
                "check",
                f"{self.binary} check exited with {out.returncode}",
                first_error=first_error(text) or (text.splitlines() or ["?"])[-1],
                returncode=out.returncode,
            )
        # The verdict is stdout's last line; warnings on stderr (CRIU prints some, such as
        # "Can't check shutdown state of inet socket", while still passing) come after it.
        verdict = out.stdout.strip().splitlines()
        return verdict[-1] if verdict else (text.splitlines() or [""])[-1]

    def require_version(self) -> CriuVersion:
        version = self.version()
        if (version.major, version.minor) < self.minimum:
            want = ".".join(map(str, self.minimum))
            raise CriuUnavailable(
                "version",
                f"{self.binary} is CRIU {version}, below {want} (older CRIUs fail on these "
                "kernels); run scripts/setup-criu.sh",
            )
        return version

    def problem(self) -> str | None:
        """Why this CRIU cannot be used here (not root, missing, too old, check fails), or
        None when it can. Meant for skip reasons and preflight messages."""
        if os.geteuid() != 0:
            return f"CRIU needs root (running as uid {os.geteuid()})"
        try:
            self.check()
        except CriuUnavailable as exc:
            return str(exc)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"cannot run {self.binary}: {exc}"
        return None

    # -- dump ----------------------------------------------------------------------------

    def dump(
        self,
        pid: int,
        images_dir: str | os.PathLike[str],
        *,
        leave_running: bool = False,
        tcp_established: bool = True,
        network_lock: str = "skip",
        link_remap: bool = True,
        file_locks: bool = True,
        shell_job: bool = False,
        extra_files: Iterable[str | os.PathLike[str]] = (),
        extra_args: Sequence[str] = (),
        timeout: float | None = 600.0,
    ) -> DumpManifest:
        """Dumps the tree rooted at `pid` into `images_dir` (new or empty) and writes the
        manifest there. The tree should run in its own session with no terminal (see
        launch.launch); else pass `shell_job`. Without `leave_running` the tree is killed once
        dumped: its root is the caller's to reap (its child, usually); the other members are
        reaped here when we are their subreaper, so their PIDs are free for a restore.

        `extra_files`: more paths (besides the image's /dev/shm files) to keep with the image
        and put back before each restore.
        """
        images = Path(images_dir)
        extras = [os.fspath(p) for p in extra_files]
        for extra in extras:
            if not os.path.isabs(extra):
                raise BackendArgumentError(f"extra_files: {extra!r} is not an absolute path")
        if _not_empty(images):
            raise BackendArgumentError(f"images_dir: {images} exists and is not an empty directory")
        if not procs.pid_exists(pid):
            raise BackendArgumentError(f"pid: no process {pid}")
        version = self.require_version()
        images.mkdir(parents=True, exist_ok=True)
        images = images.resolve()

        args = [
            "dump",
            "-t",
            str(pid),
            "-D",
            str(images),
            "-o",
            DUMP_LOG,
            f"-v{self.log_level}",
            *_options(
                ("--leave-running", leave_running),
                ("--tcp-established", tcp_established),
                ("--network-lock", network_lock),
                ("--link-remap", link_remap),
                ("--file-locks", file_locks),
                ("--shell-job", shell_job),
            ),
            *extra_args,
        ]

        # The dump holds the host's CRIU lock from before CRIU runs until its link_remap.N
        # links are gone, as a restore holds it while its saved links are back: CRIU numbers
        # those links by file id, images of the same shape share the ids, and a dump or
        # restore beside another fails ("Can't link remap ... File exists").
        with filelock.FileLock(_CRIU_LOCK):
            with tempfile.TemporaryDirectory(prefix="coldsnap-criu-") as scratch:
                save = [
                    sys.executable,
                    "-E",
                    "-s",
                    "-S",
                    str(Path(_files.__file__)),
                    str(images),
                    *extras,
                ]
                hook = _write_hook(
                    Path(scratch) / "post-dump.sh", "post-dump", [f"exec {shlex.join(save)}"]
                )
                started = time.perf_counter()
                self._run("dump", [*args, "--action-script", str(hook)], images / DUMP_LOG, timeout)
                seconds = time.perf_counter() - started

            try:
                tasks = read_pstree(images)
            except (OSError, ImageFormatError) as exc:
                raise CriuError(
                    "dump",
                    f"the image has no readable pstree.img: {exc}",
                    log_path=images / DUMP_LOG,
                ) from None
            saved = tuple(
                SavedFile(
                    path=p,
                    saved_as=_files.saved_name(p),
                    size=(images / _files.saved_name(p)).stat().st_size,
                )
                for p in _saved_paths(images)
            )
            if not leave_running and tasks[0].pid != 1:
                # The dump killed the tree. Its members other than the root (the caller's child,
                # whose status the caller may want) now belong to the nearest subreaper: if that
                # is us, reap them so their PIDs are free for a restore.
                _reap_leftovers(tasks[1:])
            if not leave_running:
                # CRIU leaves its link_remap.N links behind after a dump that kills the tree; the
                # image has copies, and a leftover would make the next dump that picks the same
                # N fail ("Can't link remap ... File exists").
                _files.remove_link_remaps([f.path for f in saved])
        manifest = DumpManifest(
            root_pid=tasks[0].pid,
            pids=tuple(sorted({t.pid for t in tasks} | {tid for t in tasks for tid in t.threads})),
            own_pid_namespace=tasks[0].pid == 1,
            leave_running=leave_running,
            criu_version=str(version),
            criu_args=tuple(args),
            kernel=platform.release(),
            seconds=round(seconds, 4),
            image_bytes=sum(f.stat().st_size for f in images.rglob("*") if f.is_file()),
            saved_files=saved,
            created_at=time.time(),
        )
        write_record(images / DUMP_MANIFEST, manifest)
        return manifest

    # -- restore -------------------------------------------------------------------------

    def restore(
        self,
        images_dir: str | os.PathLike[str],
        *,
        work_dir: str | os.PathLike[str] | None = None,
        detached: bool = True,
        stopped: bool = False,
        pidfile: str | os.PathLike[str] | None = None,
        new_pid_namespace: bool = False,
        new_net_namespace: bool = False,
        binds: Sequence[tuple[str, str]] = (),
        tcp_established: bool = True,
        file_locks: bool = True,
        output: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        timeout: float | None = 300.0,
    ) -> RestoredTree:
        """Restores an image; returns once the tree runs (or is left stopped, `stopped`).

        - `work_dir` (new or empty; default a fresh folder under images_dir/restores) gets
          CRIU's log, the pidfile and the restore record; the image directory is only read,
          except for the files put back (see below).
        - `detached`: CRIU exits and the tree is adopted by the nearest subreaper (see
          procs.become_subreaper) or PID 1. Otherwise CRIU stays as the tree's parent.
        - `new_pid_namespace`: CRIU runs as the init of a fresh PID namespace and stays (the
          namespace ends when it does), so the image's PIDs need not be free here and the
          original may still run. An image whose tree had its own PID namespace (launched with
          new_pid_namespace) always restores into a new one: its PIDs never collide.
        - `new_net_namespace` (with a new PID namespace, which it implies): the tree also gets a
          network namespace of its own, loopback up, so the TCP connections between its
          processes are connected again there while another restore of the image holds the
          same ones on this host. Nothing outside reaches its listening sockets: see
          coldsnap.backends.forward. `binds` (SOURCE, TARGET) directories are bind-mounted in
          the tree's own mount namespace before CRIU runs: its processes see SOURCE at TARGET.
        - `output`: a file (opened for appending, created if missing) that takes the place of
          the regular files the root had as stdout and stderr at dump, in every process of the
          tree that holds them (CRIU's --inherit-fd matches by path). The dump-time log, and
          its directory, need not exist then. A root whose stdout and stderr were not regular
          files (/dev/null, a pipe) has nothing to re-point: `output` is left unused.
        Before CRIU runs: the PIDs the image takes back are checked (PidCollision names the
        holder), and the files saved at dump are put back.
        """
        images = Path(images_dir).resolve()
        for needed in ("inventory.img", "pstree.img"):
            if not (images / needed).is_file():
                raise BackendArgumentError(
                    f"images_dir: {images} has no {needed}: not a CRIU image"
                )
        manifest = _read_manifest(images)
        tasks = read_pstree(images)
        own_ns = tasks[0].pid == 1
        if binds and not new_net_namespace:
            raise BackendArgumentError("binds: only a restore into new namespaces takes them")
        if new_net_namespace and own_ns:
            raise BackendArgumentError(
                "new_net_namespace: this image's tree had a PID namespace of its own, which "
                "CRIU makes again itself"
            )
        new_pid_namespace = (new_pid_namespace or new_net_namespace) and not own_ns
        attached = new_pid_namespace or not detached
        if pidfile is not None and Path(pidfile).exists():
            raise BackendArgumentError(
                f"pidfile: {pidfile} exists; CRIU needs a path that does not"
            )
        if work_dir is not None and _not_empty(Path(work_dir)):
            raise BackendArgumentError(f"work_dir: {work_dir} exists and is not an empty directory")
        if not own_ns and not new_pid_namespace:
            procs.check_pids_free({t.pid for t in tasks} | {i for t in tasks for i in t.threads})
        self.require_version()
        work = _fresh_work_dir(images, work_dir)
        pid_path = Path(pidfile) if pidfile is not None else work / RESTORED_PIDFILE
        redirected = read_stdio_paths(images) if output is not None else ()

        args = [
            "restore",
            "-D",
            str(images),
            "-W",
            str(work),
            "-o",
            RESTORE_LOG,
            f"-v{self.log_level}",
            "--pidfile",
            str(pid_path.resolve()),
            *_options(
                ("--tcp-established", tcp_established),
                ("--file-locks", file_locks),
                ("--leave-stopped", stopped),
                ("--restore-detached", not attached),
            ),
            *extra_args,
        ]
        log_path = work / RESTORE_LOG

        with (
            _opened_output(output if redirected else None) as out_fd,
            filelock.FileLock(_CRIU_LOCK),
        ):
            pass_fds = () if out_fd is None else (out_fd,)
            if out_fd is not None:
                args += _inherit_args(out_fd, redirected)
            put_back = [saved.path for saved in manifest.saved_files] if manifest else []
            for path in put_back:
                _files.put_back(images, path)
            started = time.perf_counter()
            try:
                if attached:
                    criu_pid, root = self._restore_attached(
                        args, work, log_path, tasks[0].pid, new_pid_namespace, timeout, pass_fds,
                        net=new_net_namespace, binds=binds,
                    )  # fmt: skip
                else:
                    self._run("restore", args, log_path, timeout, pass_fds)
                    criu_pid, root = None, _read_pidfile(pid_path, log_path)
            except CriuError:
                if not attached:
                    _reap_leftovers(tasks)
                _files.remove_link_remaps(put_back)  # a successful restore consumes them
                raise
            seconds = time.perf_counter() - started

        tree = RestoredTree(
            pid=root,
            images_dir=str(images),
            work_dir=str(work),
            log_path=str(log_path),
            seconds=round(seconds, 4),
            new_pid_namespace=new_pid_namespace or own_ns,
            stopped=stopped,
            criu_pid=criu_pid,
        )
        write_record(work / RESTORE_RECORD, tree)
        return tree

    def stop(self, tree: RestoredTree, timeout: float = 10.0) -> int | None:
        """Stops a restored tree (SIGTERM, then SIGKILL) and reaps what is ours: the root when
        we adopted it, and an attached CRIU. Returns the root's exit code when we reaped it
        (None when CRIU was its parent)."""
        code = procs.stop_tree(tree.pid, timeout)
        popen = self._attached.pop(tree.criu_pid, None) if tree.criu_pid else None
        if popen is not None:
            try:
                popen.wait(timeout)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout)
        return code

    # -- plumbing ------------------------------------------------------------------------

    def _command(self, args: Sequence[str]) -> list[str]:
        assert self.binary is not None
        return [str(self.binary), *args]

    def _run(
        self,
        operation: str,
        args: Sequence[str],
        log_path: Path,
        timeout: float | None,
        pass_fds: Sequence[int] = (),
    ) -> None:
        try:
            out = subprocess.run(
                self._command(args),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                pass_fds=tuple(pass_fds),
            )
        except subprocess.TimeoutExpired:
            raise CriuError(
                operation,
                f"timed out after {timeout} s",
                log_path=log_path,
                first_error=first_error_in(log_path),
            ) from None
        if out.returncode != 0:
            raise CriuError(
                operation,
                f"exited with {out.returncode}",
                log_path=log_path,
                first_error=first_error_in(log_path)
                or first_error(out.stderr)
                or (out.stderr.strip().splitlines() or [None])[-1],
                returncode=out.returncode,
            )

    def _restore_attached(
        self,
        args: list[str],
        work: Path,
        log_path: Path,
        root_pid: int,
        new_pid_namespace: bool,
        timeout: float | None,
        pass_fds: Sequence[int] = (),
        *,
        net: bool = False,
        binds: Sequence[tuple[str, str]] = (),
    ) -> tuple[int, int]:
        """Starts CRIU that stays as the tree's parent; waits for its post-resume hook. What
        the namespace helper says when it fails (before CRIU runs, so before its log) is kept
        in the work dir and named in the error."""
        marker = work / "resumed"
        tmp = shlex.quote(f"{marker}.tmp")
        hook = _write_hook(
            work / "restore-hook.sh",
            "post-resume",
            [
                f'echo "${{CRTOOLS_INIT_PID:-0}}" > {tmp}',
                f"mv {tmp} {shlex.quote(str(marker))}",
            ],
        )
        command = self._command([*args, "--action-script", str(hook)])
        if new_pid_namespace:
            unshare = shutil.which("unshare")
            if unshare is None:
                raise CriuUnavailable("restore", "new_pid_namespace needs util-linux's `unshare`")
            if net:
                helper = [sys.executable, "-E", "-s", "-S", str(_NS_CHILD)]
                for source, target in binds:
                    helper += ["--bind", f"{source}:{target}"]
                command = [*helper, "--", *command]
            namespaces = ["--net"] if net else []
            command = [unshare, "--pid", *namespaces, "--fork", "--mount-proc", *command]
        stderr_path = work / "namespaces.err"
        with open(stderr_path, "ab") as stderr:
            popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                close_fds=True,
                pass_fds=tuple(pass_fds),
                start_new_session=True,
            )
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        while not marker.exists():
            if popen.poll() is not None:
                said = stderr_path.read_text(errors="replace").strip()
                raise CriuError(
                    "restore",
                    f"exited with {popen.returncode}",
                    log_path=log_path,
                    first_error=first_error_in(log_path) or first_error(said)
                    or (said.splitlines() or [None])[-1],
                    returncode=popen.returncode,
                )  # fmt: skip
            if time.monotonic() > deadline:
                procs.stop_tree(popen.pid, 5.0, 9)
                popen.wait()
                raise CriuError(
                    "restore",
                    f"timed out after {timeout} s",
                    log_path=log_path,
                    first_error=first_error_in(log_path),
                )
            time.sleep(0.002)
        if new_pid_namespace:  # our child is `unshare`; CRIU, the namespace's init, is its child
            root = _find_ns_pid(popen.pid, root_pid)
        else:
            root = int(marker.read_text().split()[-1])
        self._attached[popen.pid] = popen
        return popen.pid, root


def _options(*pairs: tuple[str, bool | str]) -> list[str]:
    """CRIU options from (option, value) pairs: True adds the switch, a non-empty string adds
    the option and its value, False or "" adds nothing."""
    out: list[str] = []
    for option, value in pairs:
        if isinstance(value, str):
            out += [option, value] if value else []
        elif value:
            out.append(option)
    return out


def _inherit_args(fd: int, paths: Iterable[str]) -> list[str]:
    """--inherit-fd for each path: CRIU names a regular file by its path without the leading
    slash (files-reg.c, reg_file_path), and restores every descriptor of it from `fd`."""
    return [arg for path in paths for arg in ("--inherit-fd", f"fd[{fd}]:{path.lstrip('/')}")]


@contextlib.contextmanager
def _opened_output(path: str | os.PathLike[str] | None) -> Iterator[int | None]:
    """The restored tree's output file, opened for appending for as long as CRIU runs (CRIU
    duplicates it into the tree; our copy is closed after)."""
    if path is None:
        yield None
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        yield fd
    finally:
        os.close(fd)


def _write_hook(path: Path, action: str, body: list[str]) -> Path:
    """A CRIU action script that runs `body` for one action (CRIU calls it for each action,
    and execs it directly: it must be an executable file)."""
    lines = ["#!/bin/sh", f'[ "$CRTOOLS_SCRIPT_ACTION" = {action} ] || exit 0', *body]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def _saved_paths(images: Path) -> list[str]:
    root = images / _files.SAVED_DIR
    if not root.is_dir():
        return []
    return sorted("/" + str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _read_manifest(images: Path) -> DumpManifest | None:
    path = images / DUMP_MANIFEST
    return read_record(path, DumpManifest) if path.exists() else None


def _fresh_work_dir(images: Path, work_dir: str | os.PathLike[str] | None) -> Path:
    if work_dir is None:
        base = images / "restores"
        base.mkdir(exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%dT%H%M%S-"), dir=base))
    work = Path(work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    return work


def _not_empty(path: Path) -> bool:
    return path.exists() and (not path.is_dir() or any(path.iterdir()))


def _reap_leftovers(tasks: Sequence[TaskIds]) -> None:
    """Reaps killed tasks that were handed to us (we are their subreaper) so their PIDs are
    free again: after a dump that killed the tree, after a restore that failed. Tasks that are
    not ours are left to whoever reaps them."""
    for task in tasks:
        with contextlib.suppress(TimeoutError):
            procs.wait_gone(task.pid, timeout=2.0 if procs.is_subreaper() else 0.2)


def _read_pidfile(path: Path, log_path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError) as exc:
        raise CriuError("restore", f"no PID in {path}: {exc}", log_path=log_path) from None


def _find_ns_pid(ancestor: int, ns_pid: int) -> int:
    """The PID here of the descendant of `ancestor` whose PID in its own namespace is ns_pid."""
    for pid in procs.tree_pids(ancestor)[1:]:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("NSpid:"):
                        ids = line.split()[1:]
                        if len(ids) > 1 and int(ids[-1]) == ns_pid:
                            return pid
        except OSError:
            continue
    raise CriuError("restore", f"restored, but no process has PID {ns_pid} in the new namespace")
