"""The io_uring filter: io_uring_setup fails with ENOSYS under it, everything else works."""

from __future__ import annotations

import errno
import platform
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from coldsnap.backends._seccomp import IO_URING_SETUP, io_uring_filter

from .conftest import TARGETS, target, wait_for_line

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the io_uring filter is written for x86_64"
)
PROBE = re.compile(r"io_uring_setup=(-?\d+) errno=(\d+) getpid=(\w+) io=(\w+)")


def _probe_with_filter(install: bool) -> re.Match:
    """Runs the probe in a fresh interpreter that installs the filter (or not) first."""
    code = (
        "import runpy, sys\n"
        + (
            "from coldsnap.backends._seccomp import block_io_uring; block_io_uring()\n"
            if install
            else ""
        )
        + f"runpy.run_path({str(TARGETS / 'io_uring_probe.py')!r})\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    match = PROBE.search(out.stdout)
    assert match, out.stdout
    return match


def _run_bpf(program: bytes, *, arch: int, nr: int) -> int:
    """What the kernel's classic-BPF interpreter returns for one syscall, for the three
    instructions the filter uses (load a seccomp_data word, jump if equal, return)."""
    insns = [struct.unpack_from("=HBBI", program, at) for at in range(0, len(program), 8)]
    data = {0: nr, 4: arch}  # seccomp_data: nr at offset 0, arch at 4
    accumulator, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            accumulator = data[k]
        elif code == 0x15:  # BPF_JMP | BPF_JEQ | BPF_K
            pc += jt if accumulator == k else jf
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"instruction {pc}: unexpected opcode {code:#x}")
        pc += 1


X86_64, I386, X32_BIT, ALLOW = 0xC000003E, 0x40000003, 0x40000000, 0x7FFF0000
ENOSYS = 0x00050000 | errno.ENOSYS


@pytest.mark.parametrize(
    ("arch", "nr", "expected"),
    [
        (X86_64, IO_URING_SETUP, ENOSYS),
        (X86_64, X32_BIT | IO_URING_SETUP, ENOSYS),  # the x32 ABI, same number
        (I386, IO_URING_SETUP, ENOSYS),
        (X86_64, 39, ALLOW),  # getpid
        (X86_64, IO_URING_SETUP + 1, ALLOW),  # io_uring_enter: harmless without a ring
        (I386, 20, ALLOW),  # getpid on i386
        (0xC00000B7, IO_URING_SETUP, ALLOW),  # aarch64: other numbers, not ours to judge
    ],
)
def test_the_filter_refuses_only_io_uring_setup_on_each_x86_abi(arch, nr, expected) -> None:
    assert IO_URING_SETUP == 425  # the same number for x86_64, x32 and i386
    assert _run_bpf(io_uring_filter(), arch=arch, nr=nr) == expected


def test_io_uring_setup_gets_enosys_and_other_syscalls_work() -> None:
    match = _probe_with_filter(install=True)
    assert int(match[1]) == -1
    assert int(match[2]) == errno.ENOSYS
    assert match[3] == "True" and match[4] == "True"


def test_without_the_filter_io_uring_setup_is_not_enosys() -> None:
    """The control: the ENOSYS above comes from the filter, not from the kernel."""
    disabled = Path("/proc/sys/kernel/io_uring_disabled")
    if disabled.exists() and disabled.read_text().strip() != "0":
        pytest.skip("io_uring is disabled on this kernel")
    match = _probe_with_filter(install=False)
    assert int(match[2]) != errno.ENOSYS


def test_filter_is_inherited_across_fork_and_exec(tmp_path: Path) -> None:
    """What SGLang needs: children and grandchildren of the launched process are filtered."""
    code = (
        "import subprocess, sys\n"
        "from coldsnap.backends._seccomp import block_io_uring; block_io_uring()\n"
        f"subprocess.run({target('io_uring_probe.py')!r}, check=True)\n"
        "print(open('/proc/self/status').read())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    match = PROBE.search(out.stdout)
    assert match and int(match[2]) == errno.ENOSYS
    assert re.search(r"^Seccomp:\s+2$", out.stdout, re.M)


def test_launched_target_is_filtered(launched, tmp_path: Path) -> None:
    proc = launched(target("io_uring_probe.py"))
    assert proc.wait(30) == 0
    match = wait_for_line(proc.log_path, PROBE.pattern)
    assert int(match[2]) == errno.ENOSYS and match[3] == "True"


def test_launch_without_filter(launched) -> None:
    disabled = Path("/proc/sys/kernel/io_uring_disabled")
    if disabled.exists() and disabled.read_text().strip() != "0":
        pytest.skip("io_uring is disabled on this kernel")
    proc = launched(target("io_uring_probe.py"), block_io_uring=False)
    assert proc.wait(30) == 0
    match = wait_for_line(proc.log_path, PROBE.pattern)
    assert int(match[2]) != errno.ENOSYS
