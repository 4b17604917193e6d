"""The launcher's holder (`launch(..., hold=True)`): a small root that runs the program as its
only child, so that a CRIU restore reads every large process's memory at once (CRIU restores
the root's own memory only after the rest of the tree). What a caller of the launcher relies on
must hold through it: the program runs in the target's session with the same descriptors and
io_uring filter, a stop's signal reaches the program, and the launcher ends as the program did.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from coldsnap.backends.procs import tree_pids

from .conftest import proc_status, wait_for_line

# Notes a SIGTERM in the log and exits with 3; prints its own PID once the handler is set.
_TERM_3 = (
    "import os, signal, sys, time\n"
    "def term(*_):\n"
    "    print('term', flush=True)\n"
    "    sys.exit(3)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print('ready', os.getpid(), flush=True)\n"
    "time.sleep(60)\n"
)


def test_the_root_holds_the_program_as_its_only_child(launched):
    proc = launched([sys.executable, "-c", _TERM_3], hold=True)
    program = int(wait_for_line(proc.log_path, r"^ready (\d+)")[1])
    assert tree_pids(proc.pid) == [proc.pid, program]
    assert b"--hold" in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    assert b"_launch_child" not in Path(f"/proc/{program}/cmdline").read_bytes()
    for pid in (proc.pid, program):  # both in the target's session, filtered, no strays
        assert os.getsid(pid) == proc.pid
        assert proc_status(pid)["Seccomp"].strip() == "2"
        assert sorted(os.listdir(f"/proc/{pid}/fd"), key=int) == ["0", "1", "2"]
    # Small: what a restore reads for the root before the tree resumes.
    assert int(proc_status(proc.pid)["RssAnon"].split()[0]) < 32 * 1024


def test_a_stop_reaches_the_program_and_the_launcher_ends_as_it_did(launched):
    proc = launched([sys.executable, "-c", _TERM_3], hold=True)
    program = int(wait_for_line(proc.log_path, r"^ready (\d+)")[1])
    assert proc.stop(timeout=10) == 3
    assert "term" in proc.log_path.read_text()
    assert not Path(f"/proc/{program}").exists()


def test_a_program_killed_by_a_signal_ends_the_launcher_by_that_signal(launched):
    proc = launched([sys.executable, "-c", _TERM_3], hold=True)
    program = int(wait_for_line(proc.log_path, r"^ready (\d+)")[1])
    os.kill(program, signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL


def test_an_exit_code_is_passed_on(launched, tmp_path: Path):
    go = tmp_path / "go"  # the program ends only once the launch has returned
    wait_then_7 = (
        "import os, sys, time\n"
        "while not os.path.exists(sys.argv[1]):\n"
        "    time.sleep(0.01)\n"
        "raise SystemExit(7)\n"
    )
    proc = launched([sys.executable, "-c", wait_then_7, str(go)], hold=True)
    go.touch()
    assert proc.wait(30) == 7


def test_in_a_pid_namespace_the_holder_is_its_init(launched):
    proc = launched([sys.executable, "-c", _TERM_3], hold=True, new_pid_namespace=True)
    wait_for_line(proc.log_path, r"^ready")
    assert proc_status(proc.pid)["NSpid"].split() == [str(proc.pid), "1"]
    members = tree_pids(proc.pid)
    assert len(members) == 2 and proc_status(members[1])["NSpid"].split()[1] == "2"
    proc.stop(timeout=10)  # the init forwards the stop: it has a handler, so it gets it
    assert "term" in proc.log_path.read_text()
    assert not Path(f"/proc/{proc.pid}").exists()
