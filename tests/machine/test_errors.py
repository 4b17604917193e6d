"""Typed errors: a receipt (and the journal's step_fail record) keeps the error that ended an
operation as an ErrorRecord (type, branch, step, message, environment); the command line's exit
codes come from the branch; the branches are public names of `coldsnap`."""

from __future__ import annotations

import json
import threading

import pytest

import coldsnap
from coldsnap._errors import OperationError, RefusedError
from coldsnap.backends._errors import CriuUnavailable
from coldsnap.cli._errors import code_of, receipt_code
from coldsnap.machine import (
    BRANCHES,
    JOURNAL_NAME,
    ErrorRecord,
    JournalError,
    Receipt,
    RequestError,
    UndeclaredRead,
    branch_of,
    read_journal,
)
from coldsnap.machine._targets import read_receipt as _read_receipt
from coldsnap.testing import Abandoned, FaultPlan, MemoryProcessDriver, MemoryWorld

from ._support import capture_request, memory_machine


class _Failing(MemoryProcessDriver):
    """Its dump raises what the test sets."""

    error: BaseException = OperationError("the dump broke")

    def dump(self, ctx):  # type: ignore[override]
        raise self.error


def _capture(tmp_path, error: BaseException) -> Receipt:
    world = MemoryWorld()
    request = capture_request(tmp_path)
    machine = memory_machine(world, request)
    driver = _Failing(world, machine.components["engine"].launcher)
    driver.error = error
    machine.components["driver"] = driver
    return machine.capture(request)


@pytest.mark.parametrize(
    ("error", "branch", "environment"),
    [
        (OperationError("the dump broke"), "OperationError", False),
        (RefusedError("incompatible"), "RefusedError", False),
        (RuntimeError("a builtin"), "unexpected", False),
        (CriuUnavailable("version", "no criu binary found"), "OperationError", True),
        (ModuleNotFoundError("No module named 'criu'"), "unexpected", True),
    ],
)
def test_the_receipt_and_the_journal_keep_the_error_typed(
    tmp_path, error, branch, environment
) -> None:
    receipt = _capture(tmp_path, error)
    assert receipt.outcome == "rolled_back"
    failure = receipt.failure
    assert failure == ErrorRecord(
        type=type(error).__name__, branch=branch, step="process_dump", message=str(error),
        environment=environment,
    )  # fmt: skip
    assert receipt.error == failure.line()
    assert receipt.format == 2
    assert _read_receipt(tmp_path / "cap") == receipt, "the receipt on disk reads back typed"
    fails = [r for r in read_journal(tmp_path / "cap" / JOURNAL_NAME) if r.event == "step_fail"]
    assert [r.failure for r in fails] == [failure]
    assert receipt_code(receipt) == (5 if environment else 3)


def test_a_done_receipt_has_no_failure_and_a_failed_one_exits_4(tmp_path) -> None:
    world = MemoryWorld()
    request = capture_request(tmp_path)
    receipt = memory_machine(world, request).capture(request)
    assert receipt.ok and receipt.failure is None and receipt_code(receipt) == 0
    plan = FaultPlan(fail={"driver.dump", "comp:driver.cuda_unlock"})
    again = capture_request(tmp_path, workdir="cap2", name="other")
    failed = memory_machine(MemoryWorld(), again, plan).capture(again)
    assert failed.outcome == "failed"
    assert failed.failure is not None and failed.failure.step == "process_dump"
    assert failed.failure.branch == "unexpected"  # the injected fault is a RuntimeError
    assert receipt_code(failed) == 4


def test_an_undeclared_read_is_a_definition_error_in_the_receipt(tmp_path) -> None:
    receipt = _capture(tmp_path, UndeclaredRead("step 'process_dump' read fact 'x'"))
    assert receipt.failure is not None and receipt.failure.branch == "DefinitionError"


def test_an_interrupted_step_that_compensates_is_an_operation_error(tmp_path) -> None:
    world = MemoryWorld()
    request = capture_request(tmp_path)
    with pytest.raises(Abandoned):  # the launch (on_interrupt: compensate) never ends
        memory_machine(world, request, FaultPlan(abandon_at=1, abandon_after=True)).capture(
            request
        )
    receipt = memory_machine(world, request).resume(tmp_path / "cap")
    assert receipt.outcome == "rolled_back"
    assert receipt.failure is not None
    assert (receipt.failure.type, receipt.failure.branch) == ("Interrupted", "OperationError")
    assert receipt.failure.step == receipt.steps[-1].name


def test_a_cancellation_before_any_step_is_typed(tmp_path) -> None:
    world = MemoryWorld()
    request = capture_request(tmp_path)
    cancel = threading.Event()
    cancel.set()
    receipt = memory_machine(world, request).capture(request, cancel=cancel)
    assert receipt.outcome == "rolled_back"
    assert receipt.failure == ErrorRecord(
        type="Cancelled", branch="OperationError", step=None,
        message="the operation was cancelled",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RequestError([("workdir", "is missing")]), 2),
        (JournalError("no journal"), 2),
        (json.JSONDecodeError("bad", "{", 0), 2),
        (RefusedError("incompatible"), 1),
        (OperationError("broke"), 1),
        (CriuUnavailable("version", "no criu"), 5),
        (ModuleNotFoundError("No module named 'sglang'"), 5),
    ],
)
def test_exit_codes_come_from_the_branch(error, code) -> None:
    assert code_of(error) == code


def test_the_branches_are_public() -> None:
    assert [b.__name__ for b in BRANCHES] == [
        "DefinitionError", "RequestError", "OperationError", "RefusedError", "PluginError",
    ]  # fmt: skip
    for branch in BRANCHES:
        assert getattr(coldsnap, branch.__name__) is branch
        assert branch.__name__ in coldsnap.__all__
    assert coldsnap.branch_of(KeyError("x")) == "unexpected"
    assert branch_of(CriuUnavailable("version", "x")) == "OperationError"


def test_the_command_lines_summary_carries_the_typed_failure(tmp_path, capsys) -> None:
    from coldsnap.cli._errors import finish

    receipt = _capture(tmp_path, CriuUnavailable("version", "no criu binary found"))
    with pytest.raises(SystemExit) as exit_:
        finish(receipt)
    assert exit_.value.code == 5
    summary = json.loads(capsys.readouterr().out)
    assert summary["failure"] == {
        "type": "CriuUnavailable", "branch": "OperationError", "step": "process_dump",
        "message": "criu version: no criu binary found", "environment": True,
    }  # fmt: skip
