"""The launcher: own session, stdin /dev/null, appending log, no stray descriptors, PID
namespace; and the process chores (reaping, collisions, the NVIDIA mapping check)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from coldsnap.backends import (
    GpuMappingFound,
    LaunchError,
    PidCollision,
    check_pids_free,
    gpu_mappings,
    launch,
    procs,
    reap,
    refuse_gpu_mappings,
    wait_gone,
)
from coldsnap.backends.procs import describe_pid, is_subreaper

from .conftest import neglectful_parent, proc_status, target, wait_for_line, wait_for_zombie

O_APPEND = 0o2000
SLEEPER = "import time; print('ready', flush=True); time.sleep(30)"


def test_target_has_its_own_session_devnull_stdin_and_append_log(launched, tmp_path: Path):
    log = tmp_path / "t.log"
    log.write_text("earlier line\n")
    leak_r, leak_w = os.pipe()  # inheritable descriptors that must not reach the target
    os.set_inheritable(leak_r, True)
    os.set_inheritable(leak_w, True)
    try:
        proc = launched([sys.executable, "-c", SLEEPER], log_path=log)
    finally:
        os.close(leak_r)
        os.close(leak_w)
    wait_for_line(log, "^ready")
    assert os.getsid(proc.pid) == proc.pid
    assert os.getpgid(proc.pid) == proc.pid
    assert b"print('ready'" in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    assert os.readlink(f"/proc/{proc.pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{proc.pid}/fd/1") == str(log)
    flags = Path(f"/proc/{proc.pid}/fdinfo/1").read_text().split("flags:")[1].split()[0]
    assert int(flags, 8) & O_APPEND
    assert sorted(os.listdir(f"/proc/{proc.pid}/fd"), key=int) == ["0", "1", "2"]
    assert log.read_text() == "earlier line\nready\n"  # appended to, never truncated
    assert proc_status(proc.pid)["Seccomp"].strip() == "2"


def test_output_goes_to_the_log(launched):
    proc = launched([sys.executable, "-c", "print('hello from the target')"])
    assert proc.wait(30) == 0
    wait_for_line(proc.log_path, "hello from the target")


def test_new_pid_namespace(launched):
    proc = launched(["sleep", "30"], new_pid_namespace=True)
    nspid = proc_status(proc.pid)["NSpid"].split()
    assert nspid == [str(proc.pid), "1"]  # the target is its namespace's init
    assert proc.launcher.pid != proc.pid  # our child is `unshare`
    assert os.getsid(proc.pid) == proc.pid
    assert proc_status(proc.pid)["Seccomp"].strip() == "2"
    proc.stop(timeout=5)
    assert not Path(f"/proc/{proc.pid}").exists()


def test_bad_program_is_refused_before_starting():
    with pytest.raises(LaunchError, match="not a program"):
        launch(["/nonexistent/program"])


def test_subreaper_adopts_and_reaps_orphans():
    assert is_subreaper()  # set for the whole session by conftest
    # A child that starts a grandchild and exits: the grandchild becomes ours.
    out = subprocess.run(
        [sys.executable, "-c", "import subprocess; print(subprocess.Popen(['sleep', '0.2']).pid)"],
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = int(out.stdout)
    assert int(proc_status(orphan)["PPid"]) == os.getpid()
    assert wait_gone(orphan, timeout=10) == 0
    assert reap(orphan) is None


def test_pid_collision_names_the_holder():
    with pytest.raises(PidCollision) as info:
        check_pids_free([os.getpid()])
    assert info.value.pid == os.getpid()
    name = Path(f"/proc/{os.getpid()}/comm").read_text().strip()  # "python3.11", "pytest"...
    assert str(os.getpid()) in str(info.value) and name in str(info.value)
    assert "new PID namespace" in str(info.value)


def test_pid_collision_names_a_zombie_of_another_parent(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(procs, "REAPED_ELSEWHERE_S", 0.2)  # its parent never reaps it here
    parent, grandchild = neglectful_parent()
    try:
        with pytest.raises(PidCollision, match="zombie"):
            check_pids_free([grandchild])
    finally:
        parent.kill()
        parent.wait()


def test_a_zombie_that_its_parent_reaps_a_moment_later_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
):
    """As PID 1 reaps a stopped engine's root here: within 2 s, after `coldsnap stop` ended."""
    parent, grandchild = neglectful_parent()
    assert parent.stdin is not None
    stdin = parent.stdin
    seen = procs._ended_elsewhere
    told: list[int] = []

    def tell_the_parent_once_waiting(pid: int) -> bool:
        ended = seen(pid)
        if ended and not told:  # the check is waiting on the zombie: now let its parent reap
            stdin.write("reap\n")
            stdin.flush()
            told.append(pid)
        return ended

    monkeypatch.setattr(procs, "_ended_elsewhere", tell_the_parent_once_waiting)
    try:
        check_pids_free([grandchild])  # no PidCollision: its parent freed it meanwhile
        assert told == [grandchild], "the check never waited on the zombie: nothing was tested"
        assert describe_pid(grandchild).startswith("nothing")
    finally:
        stdin.close()
        parent.wait(10)


def test_a_zombie_child_of_ours_is_reaped_and_its_pid_is_free():
    """The orchestrator is a subreaper: a restored tree stopped by another process ends as
    zombies of ours, which must not block the next restore of the same image."""
    child = subprocess.Popen(["true"])
    wait_for_zombie(child.pid)
    check_pids_free([child.pid])
    assert describe_pid(child.pid).startswith("nothing")
    child.wait()  # Popen copes with a child reaped under it


@pytest.fixture
def fake_nvidia_device() -> Iterator[Path]:
    """A plain file named like an NVIDIA device file (root may create one in /dev)."""
    path = Path(f"/dev/nvidia-coldsnap-test-{uuid.uuid4().hex[:8]}")
    try:
        path.write_bytes(b"\0" * mmap.PAGESIZE)
    except OSError as exc:
        pytest.skip(f"cannot create {path}: {exc}")
    yield path
    path.unlink(missing_ok=True)


def test_gpu_mapping_check(launched, tmp_path: Path, fake_nvidia_device: Path):
    plain = tmp_path / "plain.bin"
    plain.write_bytes(b"\0" * mmap.PAGESIZE)
    library = tmp_path / "libcuda.so.fake"
    library.write_bytes(b"\0" * mmap.PAGESIZE)
    clean = launched(target("mapper.py", "--no-lock", plain, library))
    wait_for_line(clean.log_path, "ready")
    assert gpu_mappings(clean.pid) == ()  # a loaded driver library alone is allowed...
    refuse_gpu_mappings(clean.pid)
    with pytest.raises(GpuMappingFound, match=r"libcuda\.so\.fake"):  # ...unless strict
        refuse_gpu_mappings(clean.pid, strict=True)

    dirty = launched(target("mapper.py", "--no-lock", plain, fake_nvidia_device))
    wait_for_line(dirty.log_path, "ready")
    found = gpu_mappings(dirty.pid)
    assert [m.path for m in found] == [str(fake_nvidia_device)]
    with pytest.raises(GpuMappingFound) as info:
        refuse_gpu_mappings(dirty.pid)
    assert str(fake_nvidia_device) in str(info.value) and str(dirty.pid) in str(info.value)


def test_gpu_check_sees_open_descriptors_and_children(launched, fake_nvidia_device: Path):
    holder = f"import time; f = open({str(fake_nvidia_device)!r}); print('ready', flush=True); "
    code = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {holder + 'time.sleep(60)'!r}]); "
        "time.sleep(60)"
    )
    parent = launched([sys.executable, "-c", code])
    wait_for_line(parent.log_path, "ready")
    found = gpu_mappings(parent.pid)
    assert [m.path for m in found] == [str(fake_nvidia_device)] and found[0].pid != parent.pid
    assert gpu_mappings(parent.pid, recursive=False) == ()
    with pytest.raises(GpuMappingFound, match="nvidia-coldsnap-test"):
        refuse_gpu_mappings(parent.pid)
