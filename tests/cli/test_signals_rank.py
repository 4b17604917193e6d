"""SIGTERM (what a pod's shutdown sends) while the rank entry point restores: the restore is
cancelled and rolls back, the command says what to run should it be killed first, and exits
with the rolled-back code, its `finished` event last under --json."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from coldsnap.cli import _rank
from coldsnap.machine import Cancelled, ErrorRecord, Receipt

from ..capsules.test_store_steps import _seal, model  # noqa: F401  (a fixture)

ROLLED_BACK = 3


class _Restoring:
    """A Machine whose restore is signalled while it runs and ends as cancellation makes it."""

    cancelled = False

    @classmethod
    def for_request(cls, request: Any, subscribers: Any = ()) -> _Restoring:
        return cls()

    def restore(self, request: Any, *, cancel: threading.Event | None = None) -> Receipt:
        assert cancel is not None, "the entry point gave the restore no cancellation"
        signal.raise_signal(signal.SIGTERM)
        _Restoring.cancelled = cancel.wait(10)
        failure = ErrorRecord.of(Cancelled("the operation was cancelled"), None)
        return Receipt(operation="restore", spec="restore-n610", outcome="rolled_back",
                       steps=(), error=failure.line(), failure=failure,
                       workdir=request.workdir)  # fmt: skip


def test_sigterm_during_a_rank_restore_rolls_it_back(
    tmp_path: Path, model: Path, monkeypatch, capfd  # noqa: F811
) -> None:
    assert threading.current_thread() is threading.main_thread()  # where handlers run
    _seal(tmp_path, model, payload=True)
    monkeypatch.setattr(_rank, "Machine", _Restoring)
    workdir = tmp_path / "op"
    result = CliRunner().invoke(_rank.rank, [
        "--runtime-dir", str(tmp_path / "store"), "--capsule", "cap", "--workdir", str(workdir),
        "--rank", "0", "--json"])  # fmt: skip
    assert _Restoring.cancelled, "SIGTERM did not cancel the restore"
    assert result.exit_code == ROLLED_BACK, result.output
    last = json.loads(result.stdout.splitlines()[-1])
    assert (last["event"], last["status"]) == ("finished", "rolled_back")
    err = capfd.readouterr().err
    assert "SIGTERM: cancelling" in err and f"run: coldsnap resume {workdir}" in err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.fixture(autouse=True)
def _default_sigterm():
    """The test asserts SIGTERM's handler is put back: it starts from the default."""
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, before)
