"""Process-tree chores around snapshots: adopting and reaping, stopping, PID collisions, and
the check for NVIDIA driver state.

Why these matter: a restore takes back the dumped PIDs and fails while any of them is held,
also by a zombie nobody reaped (PID 1 on these VMs reaps orphans lazily). A controller that is
a child subreaper adopts what `criu restore -d` detaches and can reap it itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fnmatch
import os
import signal
import time
from collections.abc import Iterable

import psutil
from attrs import frozen

from ._errors import GpuMappingFound, PidCollision, PidStillHeld

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37

# Paths that mean "this process holds NVIDIA driver state": the driver's device files, which a
# process opens and maps from cuInit on (and NVML's init). Measured on the H200 machine: a
# process that only imported a CUDA build of torch maps libcuda.so but no device file, and
# after a CRIU dump and restore it initialized CUDA and computed on the GPU, twice. So loaded
# driver libraries alone are allowed by default; `strict=True` refuses them too.
GPU_STATE_PATTERNS: tuple[str, ...] = ("/dev/nvidia*",)
NVIDIA_LIBRARY_PATTERNS: tuple[str, ...] = (
    "*/libcuda.so*",
    "*/libnvidia-*.so*",
    "*/libnvcuvid.so*",
)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def become_subreaper(enable: bool = True) -> None:
    """Makes this process adopt orphaned descendants (prctl PR_SET_CHILD_SUBREAPER); with
    `enable=False`, stops doing so (orphans then go to the next subreaper up, or PID 1)."""
    if _libc().prctl(_PR_SET_CHILD_SUBREAPER, int(enable), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def is_subreaper() -> bool:
    flag = ctypes.c_int(0)
    if _libc().prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_GET_CHILD_SUBREAPER): {os.strerror(err)}")
    return bool(flag.value)


def reap(pid: int) -> int | None:
    """Reaps `pid` if it is a child of ours that has ended. Returns its exit code (negative:
    killed by that signal), or None when it still runs or is not our child."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if got == 0:
        return None
    return os.waitstatus_to_exitcode(status)


def reap_children() -> dict[int, int]:
    """Reaps every ended child of ours (adopted ones too). Returns {pid: exit code}."""
    reaped: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped[pid] = os.waitstatus_to_exitcode(status)


def pid_exists(pid: int) -> bool:
    """True while anything holds `pid` in our PID namespace: a process, a thread or a zombie."""
    return os.path.exists(f"/proc/{pid}")


def _boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def start_stamp(pid: int | None) -> str | None:
    """What tells this process apart from every other that has held or will hold `pid`: the
    host's boot id and the process's start time in clock ticks since boot (/proc/PID/stat,
    field 22), or None when no process holds `pid`.

    A PID and the environment are no identity for a restored process: CRIU gives every restore
    of one image the same PIDs and environment, so a replica restored after another crashed
    looks exactly like it. Its start time does not: the kernel sets it when CRIU forks the
    task, once per restore. Exact integers, unlike psutil's create_time (boot time plus a
    float), so a recorded stamp compares equal only to the same process."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        ticks = stat[stat.rindex(")") + 2 :].split()[19]  # fields after the command's name
        return f"{_boot_id()}:{int(ticks)}"
    except (OSError, ValueError, IndexError):
        return None


def running(
    pid: int | None, *, environ: tuple[str, str] | None = None, started: str | None = None
) -> bool:
    """Whether `pid` is a live process: it exists and has not ended (a zombie, or one being
    torn down, has). With `environ=(name, value)`, also that its initial environment sets
    `name` to `value`; with `started`, also that its `start_stamp` is that one: a PID that
    another process took since fails these checks (the stamp even when the other process is a
    replica restored from the same image), so a caller that signals only what passes them
    never signals a stranger. A process whose environment cannot be read is not taken for the
    one asked about."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return False
        if started is not None and start_stamp(pid) != started:
            return False
        if environ is None:
            return True
        name, value = environ
        return proc.environ().get(name) == value
    except (psutil.Error, OSError):
        return False


ANOTHER_REAPER_S = 0.5
"""How long `wait_gone` waits for another process to reap an ended process it is the parent of."""


def wait_gone(pid: int, timeout: float = 10.0) -> int | None:
    """Waits until `pid` is free, reaping it when it is our child. Returns its exit code when
    we reaped it. A process that has ended but is another process's zombie is waited for at
    most ANOTHER_REAPER_S more, then left: only that parent can free its PID, and it holds
    nothing else. A stop run from another process than the one that restored an engine (`coldsnap
    stop`) finds the engine's root such a zombie of that process, a subreaper that reaps only
    when it next runs; waiting for it would only wait out the timeout. A restore that needs the
    PID waits for that reaping itself (`check_pids_free`). Raises PidStillHeld (a TimeoutError)
    naming what still holds it."""
    deadline = time.monotonic() + timeout
    code: int | None = None
    while True:
        got = reap(pid)
        if got is not None:
            code = got
        if not pid_exists(pid):
            return code
        now = time.monotonic()
        if _ended_elsewhere(pid):
            deadline = min(deadline, now + ANOTHER_REAPER_S)
            if now >= deadline:
                return code
        elif now >= deadline:
            raise PidStillHeld(pid, describe_pid(pid), timeout)
        time.sleep(0.01)


def _status(pid: int) -> dict[str, str] | None:
    """/proc/PID/status as fields, or None when nothing holds `pid`."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return None


def _ended_elsewhere(pid: int) -> bool:
    """Whether `pid` has ended and waits for a parent other than this process to reap it: a
    zombie with no thread left (a killed process's leader is a zombie while its other threads
    still exit and hold its memory, files and device)."""
    fields = _status(pid)
    if fields is None or not fields.get("State", "").startswith("Z"):
        return False
    return fields.get("Threads") == "1" and fields.get("PPid") != str(os.getpid())


def describe_pid(pid: int) -> str:
    """Says what holds a PID: name, state and parent; a thread is named by its process."""
    fields = _status(pid)
    if fields is None:
        return "nothing (it is free now)"
    name, state = fields.get("Name", "?"), fields.get("State", "?")
    tgid, ppid = int(fields.get("Tgid", pid)), fields.get("PPid", "?")
    what = f"'{name}' (state {state}, parent {ppid})"
    what = f"a thread of process {tgid} {what}" if tgid != pid else f"process {what}"
    if state.startswith("Z"):
        what += ", a zombie its parent has not reaped"
    return what


REAPED_ELSEWHERE_S = 3.0
"""How long `check_pids_free` waits for another process to reap a zombie that holds a PID: PID 1
on these VMs reaps orphans lazily (measured: 1.3-2.0 s after they end)."""


def check_pids_free(pids: Iterable[int]) -> None:
    """Raises PidCollision for the first PID in use, naming what holds it. A zombie child of
    ours is reaped first: an orchestrator is a subreaper, so a restored tree that another
    process stopped (`coldsnap stop`) ends as its zombies, which would hold the image's PIDs.
    A zombie of another process is given REAPED_ELSEWHERE_S to be reaped there: a stop returns
    once its engine has ended (`wait_gone`), and a restore of the same image right after it
    may find its PIDs still held by zombies that PID 1 reaps a moment later."""
    for pid in sorted(set(pids)):
        if pid_exists(pid) and reap(pid) is None and not _reaped_elsewhere(pid):
            raise PidCollision(pid, describe_pid(pid))


def _reaped_elsewhere(pid: int) -> bool:
    """Whether `pid`, held by a process that has ended as another's zombie, is freed by that
    parent within REAPED_ELSEWHERE_S (False at once for a live holder)."""
    deadline = time.monotonic() + REAPED_ELSEWHERE_S
    while _ended_elsewhere(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return not pid_exists(pid)


def tree_pids(pid: int) -> list[int]:
    """`pid` and all its descendants (processes, not threads), root first."""
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def host_pid(root: int, pid: int) -> int:
    """The PID on this host of the process of `root`'s tree that has `pid` in `root`'s PID
    namespace: a tree restored into a namespace of its own names its processes (in records
    its processes write, in the image) by PIDs that mean others, or nothing, here. `pid`
    itself when `root` shares this process's PID namespace or no member of its tree has it
    (a caller that checks membership then names the stranger)."""
    try:
        if os.readlink(f"/proc/{root}/ns/pid") == os.readlink("/proc/self/ns/pid"):
            return pid
    except OSError:
        return pid
    for member in tree_pids(root):
        if namespace_pid(member) == pid:
            return member
    return pid


def namespace_pid(pid: int) -> int | None:
    """`pid`'s PID in its own (innermost) PID namespace (NSpid's last), or None when gone."""
    nspid = (_status(pid) or {}).get("NSpid", "").split()
    return int(nspid[-1]) if nspid else None


def stop_tree(pid: int, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
    """Stops a process tree: `sig` to the root, which gets up to `timeout` to end; the rest of
    the tree then gets a short grace (up to 1 s) to end on its own, as helpers that clean up
    after their parent do; SIGKILL for what is left. Reaps what is ours. Returns the root's
    exit code when we reaped it."""
    deadline = time.monotonic() + timeout
    members = tree_pids(pid)
    if not members:
        return reap(pid)
    if _signal_dropped(pid, sig):
        sig = signal.SIGKILL
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    for member in members:  # a stopped task (e.g. restored with stopped=True) acts only then
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGCONT)
    codes: dict[int, int | None] = {}
    with contextlib.suppress(TimeoutError):
        codes[pid] = wait_gone(pid, max(0.0, deadline - time.monotonic()))
    grace = time.monotonic() + min(1.0, max(0.0, deadline - time.monotonic()))
    for member in members[1:]:
        with contextlib.suppress(TimeoutError):
            codes[member] = wait_gone(member, max(0.0, grace - time.monotonic()))
    survivors = [m for m in [*members, *tree_pids(pid)] if m not in codes and pid_exists(m)]
    for member in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
    for member in survivors:
        with contextlib.suppress(TimeoutError):  # not ours, and its parent does not reap
            codes[member] = wait_gone(member, 2.0)
    return codes.get(pid)


def kill_tree(pid: int, timeout: float = 20.0) -> int | None:
    """SIGKILL to every process of a tree at once, for a tree whose state no longer matters (a
    captured source): no drain, no grace. Waits up to `timeout` for the PIDs to be free (a
    killed CUDA process may take a while to release the device), reaping what is ours. Returns
    the root's exit code when we reaped it. Members are killed leaves first and the root last:
    a kill cut short (its orchestrator killed) leaves what is left of the tree under the root,
    where a retry that knows only the root's PID finds it; killed root first, the rest would be
    orphans nobody names."""
    deadline = time.monotonic() + timeout
    members = tree_pids(pid)
    if not members:
        return reap(pid)
    # Leaves first (tree_pids lists a parent before its children); SIGKILL ends stopped tasks too.
    for member in reversed(members):
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
    codes: dict[int, int | None] = {}
    for member in members:
        with contextlib.suppress(TimeoutError):  # not ours, and its parent does not reap
            codes[member] = wait_gone(member, max(0.0, deadline - time.monotonic()))
    return codes.get(pid)


def _signal_dropped(pid: int, sig: int) -> bool:
    """The kernel drops a signal sent from outside to a PID namespace's init unless the init
    catches it (SIGKILL excepted), so SIGTERM to a `sleep` running as init does nothing."""
    fields = _status(pid)
    if fields is None:
        return False
    nspid = fields.get("NSpid", "").split()
    if sig == signal.SIGKILL or len(nspid) < 2 or nspid[-1] != "1":
        return False
    return not int(fields.get("SigCgt", "0"), 16) & (1 << (sig - 1))


@frozen
class GpuMapping:
    """One NVIDIA path that a process maps or holds open."""

    pid: int
    path: str


def gpu_mappings(
    pid: int, *, recursive: bool = True, strict: bool = False
) -> tuple[GpuMapping, ...]:
    """The NVIDIA driver state in `pid` and (by default) its descendants: mappings from
    /proc/PID/maps and open descriptors from /proc/PID/fd whose path matches
    GPU_STATE_PATTERNS, and with `strict` also NVIDIA_LIBRARY_PATTERNS."""
    patterns = GPU_STATE_PATTERNS + (NVIDIA_LIBRARY_PATTERNS if strict else ())
    found: list[GpuMapping] = []
    for member in tree_pids(pid) if recursive else [pid]:
        seen: set[str] = set()
        for path in _mapped_paths(member) + _open_paths(member):
            if path in seen:
                continue
            seen.add(path)
            if any(fnmatch.fnmatch(path, pattern) for pattern in patterns):
                found.append(GpuMapping(member, path))
    return tuple(found)


def refuse_gpu_mappings(pid: int, *, strict: bool = False) -> None:
    """Raises GpuMappingFound naming the first NVIDIA path in the tree of `pid` (see
    gpu_mappings): a template to be dumped by plain CRIU must hold no CUDA state."""
    found = gpu_mappings(pid, strict=strict)
    if found:
        raise GpuMappingFound(found[0].pid, found[0].path)


def _mapped_paths(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            return []
        raise
    paths = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            paths.append(parts[5].removesuffix(" (deleted)"))
    return paths


def _open_paths(pid: int) -> list[str]:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    paths = []
    for name in names:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            if target.startswith("/"):
                paths.append(target.removesuffix(" (deleted)"))
    return paths
