"""Who an engine started under a launch holder is: the engine's HTTP server writes its status
record as the held program, while the driver journals the tree's root (the holder) as the
engine's PID. The steps that read that record must take the held program for the engine's own
process (and nothing else): otherwise a restored engine's gate is never seen open, and a sleep's
release refuses the record as "written by pid N+1, not N"."""

from __future__ import annotations

import os
import sys

from coldsnap.backends.launch import held_program
from coldsnap.engines.sglang._steps import _engine_wrote

from .conftest import wait_for_line

_READY = "import os, time\nprint('ready', os.getpid(), flush=True)\ntime.sleep(60)\n"


def test_a_holder_names_its_program_and_a_plain_root_names_none(launched):
    held = launched([sys.executable, "-c", _READY], hold=True)
    program = int(wait_for_line(held.log_path, r"^ready (\d+)")[1])
    plain = launched([sys.executable, "-c", _READY])
    wait_for_line(plain.log_path, r"^ready (\d+)")
    assert held_program(held.pid) == program
    assert held_program(plain.pid) is None
    assert held_program(os.getpid()) is None


def test_the_engines_record_is_its_held_programs_or_its_roots_and_no_one_elses(launched):
    held = launched([sys.executable, "-c", _READY], hold=True)
    program = int(wait_for_line(held.log_path, r"^ready (\d+)")[1])
    assert _engine_wrote(program, held.pid)
    assert _engine_wrote(held.pid, held.pid)
    assert not _engine_wrote(os.getpid(), held.pid)
    plain = launched([sys.executable, "-c", _READY])
    wait_for_line(plain.log_path, r"^ready (\d+)")
    assert _engine_wrote(plain.pid, plain.pid)
    assert not _engine_wrote(program, plain.pid)
