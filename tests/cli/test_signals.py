"""SIGINT and SIGTERM while a command runs an operation cancel it, and say what to run; an
operation whose journal could not be written ends the command with that same line (the real
commands under the signals: tests/drivers/test_signals_toy.py)."""

from __future__ import annotations

import json
import signal
import threading

import pytest

from coldsnap.cli._errors import FAILED, code_of
from coldsnap.cli._signals import interrupts
from coldsnap.machine import ErrorRecord, JournalUnwritable, Receipt


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_cancels_the_operation_and_names_the_resume_command(tmp_path, capfd, sig):
    # Python runs signal handlers in the main thread only: elsewhere SIGTERM would end pytest.
    assert threading.current_thread() is threading.main_thread()
    before = signal.getsignal(sig)
    workdir = tmp_path / "op dir"
    with interrupts(str(workdir)) as cancel:
        signal.raise_signal(sig)  # neither KeyboardInterrupt nor the end of this process
        assert cancel.wait(10), "the signal did not cancel the operation"
        signal.raise_signal(sig)  # a second one: the rollback goes on
    err = capfd.readouterr().err
    assert f"{sig.name}: cancelling" in err
    assert f"{sig.name}: already cancelling" in err
    assert err.count(f"run: coldsnap resume '{workdir}'") == 2
    assert signal.getsignal(sig) is before, "the handler before was not put back"


def _receipt(workdir: str) -> Receipt:
    error = JournalUnwritable("the disk is full")
    return Receipt(operation="capture", spec="capture-n610", outcome="rolled_back", steps=(),
                   error="OSError: no space", failure=ErrorRecord.of(error, "process_dump"),
                   workdir=workdir)  # fmt: skip


def test_an_unwritable_journal_ends_the_command_with_the_resume_line(tmp_path, capsys):
    workdir = str(tmp_path / "cap")
    receipt = _receipt(workdir)
    with pytest.raises(SystemExit) as ended, interrupts(workdir, events=True):
        raise JournalUnwritable(f"{workdir}: the journal could not be written", receipt)
    assert ended.value.code == FAILED
    out, err = capsys.readouterr()
    event = json.loads(out.splitlines()[-1])
    assert (event["event"], event["status"]) == ("finished", "rolled_back")
    assert event["result"]["resume"] == f"coldsnap resume {workdir}"
    assert f"run: coldsnap resume {workdir}" in err


def test_an_unwritable_journal_is_exit_code_4_wherever_it_is_raised():
    assert code_of(JournalUnwritable("full", _receipt("/w"))) == FAILED
