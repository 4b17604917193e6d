"""Probes of what a host offers the backends: AMX, the CRIU AMX restorer patch (checked by a real
dump and restore), CRIU's kernel features, the io_uring filter, the NVIDIA driver. Read by
`coldsnap doctor`; each is a small function that says what it found and never changes the host
beyond the temporary process and images it makes.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attrs import frozen

from ._errors import BackendError
from .criu import Criu
from .launch import launch
from .procs import become_subreaper

CPUINFO = Path("/proc/cpuinfo")
NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
NVIDIA_VERSION = Path("/proc/driver/nvidia/version")
XFEATURE_XTILEDATA = 18

_AMX_TARGET = """
import ctypes, signal, time
libc = ctypes.CDLL(None, use_errno=True)
def perm():
    mask = ctypes.c_uint64(0)
    if libc.syscall(158, 0x1022, ctypes.byref(mask)) != 0:  # ARCH_GET_XCOMP_PERM
        return -1
    return mask.value
rc = libc.syscall(158, 0x1023, 18)  # ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
print(f"request={rc} perm={perm()}", flush=True)
signal.signal(signal.SIGUSR1, lambda *_: print(f"perm={perm()}", flush=True))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""

_IO_URING_TARGET = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)  # struct io_uring_params
fd = libc.syscall(425, 1, params)  # io_uring_setup
print(f"io_uring_setup={fd} errno={ctypes.get_errno()}", flush=True)
"""


class ProbeError(BackendError):
    """A probe could not run to its verdict (the target died, a line never came)."""


def cpu_has_amx(cpuinfo: Path = CPUINFO) -> bool:
    """True when the CPU advertises AMX tile support (the `amx_tile` flag)."""
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return "amx_tile" in line.split()
    return False


@frozen
class AmxProbe:
    """What a process that asked for AMX tile data had before a dump and after its restore:
    the kernel's answer to the request and the XCOMP permission masks (-1: unreadable)."""

    request: int
    before: int
    after: int

    @property
    def asked(self) -> bool:
        return (
            self.request == 0 and self.before >= 0 and bool(self.before >> XFEATURE_XTILEDATA & 1)
        )

    @property
    def kept(self) -> bool:
        return self.after >= 0 and bool(self.after >> XFEATURE_XTILEDATA & 1)


def amx_restore_probe(criu: Criu, timeout: float = 60.0) -> AmxProbe:
    """Starts a small process that asks for AMX tile data, dumps it with `criu`, restores it and
    reads its permission again: with our restorer patch the restored process holds the
    permission (`kept`), without it the permission is gone (the next AMX instruction would be
    SIGILL). Needs root and a usable CRIU; everything it made is stopped and removed. Raises
    ProbeError when the probe cannot reach a verdict, CriuError from CRIU itself."""
    with tempfile.TemporaryDirectory(prefix="coldsnap-amx-probe-") as tmp:
        work = Path(tmp)
        script = work / "amx_target.py"
        script.write_text(_AMX_TARGET)
        log = work / "target.log"
        become_subreaper()
        try:
            proc = launch([sys.executable, "-S", str(script)], log_path=log)
            try:
                first = _wait_line(log, r"request=(-?\d+) perm=(-?\d+)", 0, timeout)
                _wait_line(log, r"^ready$", 0, timeout)
                criu.dump(proc.pid, work / "image", tcp_established=False)
            finally:
                proc.stop(timeout=5)
            offset = log.stat().st_size
            tree = criu.restore(work / "image", work_dir=work / "restore", tcp_established=False)
            try:
                os.kill(tree.pid, signal.SIGUSR1)
                after = _wait_line(log, r"^perm=(-?\d+)$", offset, timeout)
            finally:
                criu.stop(tree, timeout=5)
        finally:
            become_subreaper(enable=False)
    return AmxProbe(int(first[1]), int(first[2]), int(after[1]))


def criu_feature(criu: Criu, feature: str) -> bool:
    """`criu check --feature FEATURE` passes (CRIU names its kernel features: clone3_set_tid,
    seccomp_filters, ...). Raises CriuUnavailable when there is no usable CRIU."""
    criu.require_version()
    out = subprocess.run(
        [str(criu.binary), "check", "--feature", feature],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.returncode == 0


def ns_last_pid_writable(path: Path = NS_LAST_PID) -> bool:
    """The old way CRIU restores PIDs: writing the next PID to /proc/sys/kernel/ns_last_pid."""
    return path.exists() and os.access(path, os.W_OK)


def io_uring_blocked(timeout: float = 30.0) -> tuple[bool, str]:
    """Whether a process started by `launch` (with its io_uring filter) is told ENOSYS by
    io_uring_setup, and what it saw. Raises LaunchError or ProbeError when it cannot tell."""
    with tempfile.TemporaryDirectory(prefix="coldsnap-uring-probe-") as tmp:
        script = Path(tmp) / "uring_target.py"
        script.write_text(_IO_URING_TARGET)
        log = Path(tmp) / "target.log"
        proc = launch([sys.executable, "-S", str(script)], log_path=log)
        try:
            found = _wait_line(log, r"io_uring_setup=(-?\d+) errno=(\d+)", 0, timeout)
        finally:
            proc.stop(timeout=5)
    fd, err = int(found[1]), int(found[2])
    if fd < 0 and err == errno.ENOSYS:
        return True, "io_uring_setup answers ENOSYS under coldsnap's seccomp filter"
    if fd >= 0:
        return False, "io_uring_setup succeeded under coldsnap's seccomp filter"
    return False, f"io_uring_setup failed with {errno.errorcode.get(err, err)}, not ENOSYS"


def nvidia_driver_major(path: Path = NVIDIA_VERSION) -> int | None:
    """The NVIDIA kernel driver's major version (580 for 580.95.05), None without the driver."""
    try:
        text = path.read_text()
    except OSError:
        return None
    found = re.search(r"\b(\d{3,})\.\d+(?:\.\d+)?\b", text)
    return int(found[1]) if found else None


def gpu_host() -> bool:
    """An NVIDIA GPU host: the kernel driver is loaded or a device node is there."""
    return NVIDIA_VERSION.exists() or Path("/dev/nvidia0").exists()


def _wait_line(log: Path, pattern: str, offset: int, timeout: float) -> re.Match[str]:
    regex = re.compile(pattern, re.MULTILINE)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")[offset:] if log.exists() else ""
        found = regex.search(text)
        if found:
            return found
        time.sleep(0.02)
    tail = log.read_text(errors="replace")[-500:] if log.exists() else "(no output)"
    raise ProbeError(f"probe: no line matching {pattern!r} within {timeout} s; it said {tail!r}")


__all__ = [
    "AmxProbe",
    "ProbeError",
    "amx_restore_probe",
    "cpu_has_amx",
    "criu_feature",
    "gpu_host",
    "io_uring_blocked",
    "ns_last_pid_writable",
    "nvidia_driver_major",
]
