"""The io_uring filter: io_uring_setup fails with ENOSYS under it, everything else works."""

from __future__ import annotations

import errno
import platform
import re
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


def test_program_shape() -> None:
    program = io_uring_filter()
    assert len(program) == 10 * 8  # ten struct sock_filter instructions
    assert IO_URING_SETUP == 425


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
