"""The first program of a launched target: own session, optional io_uring filter, then exec.

Run as a script, `python -E -s -S _launch_child.py [--no-io-uring] -- PROGRAM ARGS...`, so it
starts in a few milliseconds, loads nothing of the caller's, and is replaced by PROGRAM. Doing
this here rather than in a `preexec_fn` keeps the launch safe from a multithreaded caller.
"""

from __future__ import annotations

import os
import sys

if __package__:
    from ._seccomp import block_io_uring
else:  # run as a script: this file's folder is sys.path[0]
    from _seccomp import block_io_uring  # type: ignore[import-not-found,no-redef]


def main(argv: list[str]) -> int:
    no_io_uring = False
    while argv and argv[0] != "--":
        flag = argv.pop(0)
        if flag == "--no-io-uring":
            no_io_uring = True
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
    try:
        os.execvp(program[0], program)
    except OSError as exc:
        print(f"launch: cannot run {program[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
