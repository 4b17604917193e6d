"""The first program of a launched target: own session, optional io_uring filter, then exec.

Run as a script, `python -E -s -S _launch_child.py [--no-io-uring] [--hold] -- PROGRAM ARGS...`,
so it starts in a few milliseconds, loads nothing of the caller's, and is replaced by PROGRAM.
Doing this here rather than in a `preexec_fn` keeps the launch safe from a multithreaded caller.

With `--hold` it is not replaced: it runs PROGRAM as its only child, passes on the signals a
stop sends, reaps, and exits as PROGRAM did. The tree's root is then this small process, not
PROGRAM. Why: CRIU restores the root's memory only after every other task of the tree has
restored its own (cr-restore.c, restore_wait_other_tasks), so a large root reads its pages
alone once its children are done; under a small root every large process of the tree reads
its pages at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

if __package__:
    from ._seccomp import block_io_uring
else:  # run as a script: this file's folder is sys.path[0]
    from _seccomp import block_io_uring  # type: ignore[import-not-found,no-redef]


def main(argv: list[str]) -> int:
    no_io_uring = hold = False
    while argv and argv[0] != "--":
        flag = argv.pop(0)
        if flag == "--no-io-uring":
            no_io_uring = True
        elif flag == "--hold":
            hold = True
        else:
            print(f"launch: unknown flag {flag!r}", file=sys.stderr)
            return 2
    if not argv or len(argv) < 2:
        print("launch: nothing to run after '--'", file=sys.stderr)
        return 2
    program = argv[1:]
    # A session of its own and no terminal: CRIU then needs no --shell-job, and in a new PID
    # namespace the session leader must be inside the namespace.
    if os.getsid(0) != os.getpid():
        os.setsid()
    if no_io_uring:
        block_io_uring()
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    if hold:
        return _hold(program)
    return _exec(program)


def _exec(program: list[str]) -> int:
    try:
        os.execvp(program[0], program)
    except OSError as exc:
        print(f"launch: cannot run {program[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)  # fmt: skip
"""What a stop or an operator sends the tree's root, passed on to PROGRAM (SIGKILL and
SIGSTOP cannot be caught: a tree is killed member by member)."""


def _hold(program: list[str]) -> int:
    """Runs PROGRAM as the only child and waits for it; returns its exit code, and when a
    signal N ended it, ends by N too (a PID namespace's init, which cannot, returns 128 + N).
    Signals that arrive before the child exists are held back by the mask and
    forwarded once it does. Every child that ends is reaped: as a PID namespace's init, the
    orphans of the tree are this process's to reap."""
    child = 0

    def forward(signum: int, _frame: object) -> None:
        if child:
            with contextlib.suppress(ProcessLookupError):  # ended: the wait below sees it
                os.kill(child, signum)

    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    for signum in FORWARDED:
        signal.signal(signum, forward)
    child = os.fork()
    if child == 0:
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)  # a mask survives exec
        os._exit(_exec(program))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # someone else reaped it: its status is lost
            print(f"launch: the program ({child}) was reaped elsewhere", file=sys.stderr)
            return 1
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            if code < 0:  # end as PROGRAM did, so the launcher's status says the same
                if -code in FORWARDED:
                    signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
                return 128 - code  # a PID namespace's init ignores it: the shell's convention
            return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
