"""The journal and the workdir it lives in: torn and damaged lines, unknown steps, an end record
without a receipt, one orchestrator per workdir, and what a journal says about the components
(and whether the operation was a dry run) that resume must match."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from coldsnap.machine import JOURNAL_NAME, JournalError, Machine, _journal, read_journal
from coldsnap.testing import Abandoned, FaultPlan, MemoryWorld

from ._support import Gate, capture_request, memory_machine


def _machine(world: MemoryWorld, tmp: Path, plan: FaultPlan | None = None, **kw) -> Machine:
    return memory_machine(world, capture_request(tmp), plan, **kw)


def _interrupted(tmp: Path, world: MemoryWorld, at: int = 2, **kw) -> Path:
    """A capture whose orchestrator 'died' at its `at`-th call, its journal left as it was."""
    with pytest.raises(Abandoned):
        _machine(world, tmp, FaultPlan(abandon_at=at), **kw).capture(capture_request(tmp))
    return tmp / "cap"


def test_the_begin_record_names_the_components_and_whether_it_is_a_dry_run(tmp_path) -> None:
    world = MemoryWorld()
    assert _machine(world, tmp_path, dry_run=True).capture(capture_request(tmp_path)).ok
    begin = read_journal(tmp_path / "cap" / JOURNAL_NAME)[0]
    assert begin.dry_run is True
    assert begin.components == {
        "driver": "n610", "provider": "native", "engine": "sglang", "artifacts": "store",
    }  # fmt: skip


def test_resume_of_a_dry_run_with_real_components_is_refused(tmp_path) -> None:
    world = MemoryWorld()
    workdir = _interrupted(tmp_path, world, dry_run=True)
    calls = len(world.calls)
    with pytest.raises(JournalError, match="dry run"):
        _machine(world, tmp_path).resume(workdir)
    assert len(world.calls) == calls, "nothing ran"
    assert _machine(world, tmp_path, dry_run=True).resume(workdir).ok


def test_resume_with_other_components_is_refused_naming_them(tmp_path) -> None:
    world = MemoryWorld()
    workdir = _interrupted(tmp_path, world)
    machine = _machine(world, tmp_path)
    machine.components["provider"].name = "recovery"
    with pytest.raises(JournalError, match="provider: journaled 'native', this machine 'recovery'"):
        machine.resume(workdir)


def test_a_torn_last_line_is_cut_before_the_next_append(tmp_path) -> None:
    world = MemoryWorld()
    workdir = _interrupted(tmp_path, world)
    path = workdir / JOURNAL_NAME
    with path.open("a") as f:
        f.write('{"seq": 4, "event": "step_st')
    assert _machine(world, tmp_path).resume(workdir).ok
    records = read_journal(path)  # the torn line must not be left in the middle
    assert records[-1].event == "end"
    assert [r.seq for r in records] == list(range(len(records)))


def test_a_garbage_last_line_is_cut_too(tmp_path) -> None:
    world = MemoryWorld()
    workdir = _interrupted(tmp_path, world)
    path = workdir / JOURNAL_NAME
    with path.open("ab") as f:
        f.write(b"\x00\xffgarbage\n")
    assert _machine(world, tmp_path).resume(workdir).ok
    assert read_journal(path)[-1].event == "end"


def test_a_non_utf8_middle_line_is_a_journal_error(tmp_path) -> None:
    world = MemoryWorld()
    workdir = _interrupted(tmp_path, world)
    path = workdir / JOURNAL_NAME
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([lines[0], b"\xff\xfe\n", *lines[1:]]))
    with pytest.raises(JournalError, match=":2: "):
        read_journal(path)


def test_an_unknown_step_is_a_journal_error(tmp_path) -> None:
    world = MemoryWorld()
    workdir = _interrupted(tmp_path, world)
    path = workdir / JOURNAL_NAME
    lines = path.read_text().splitlines()
    record = json.loads(lines[-1])
    record["step"] = "no_such_step"
    path.write_text("\n".join([*lines[:-1], json.dumps(record)]) + "\n")
    with pytest.raises(JournalError, match="no_such_step"):
        _machine(world, tmp_path).resume(workdir)


def test_an_unknown_step_names_the_line_that_names_it(tmp_path) -> None:
    """Of a journal's records, the one naming a step the spec does not run is named by its
    line, so an operator can look at it (a middle line here, not the last)."""
    world = MemoryWorld()
    workdir = _interrupted(tmp_path, world, at=4)
    path = workdir / JOURNAL_NAME
    lines = path.read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if json.loads(text)["event"] == "step_end")
    record = json.loads(lines[line - 1])
    record["step"] = "no_such_step"
    lines[line - 1] = json.dumps(record)
    assert line < len(lines)
    path.write_text("\n".join(lines) + "\n")
    named = rf"{JOURNAL_NAME}:{line}: names step\(s\) 'no_such_step'"
    with pytest.raises(JournalError, match=named):
        _machine(world, tmp_path).resume(workdir)


def test_an_end_record_without_a_receipt_resumes_to_the_receipt(tmp_path) -> None:
    world = MemoryWorld()
    receipt = _machine(world, tmp_path).capture(capture_request(tmp_path))
    (tmp_path / "cap" / "receipt.json").unlink()
    again = _machine(world, tmp_path).resume(tmp_path / "cap")
    assert again.outcome == receipt.outcome == "done"
    assert [s.name for s in again.steps] == [s.name for s in receipt.steps]
    assert again.facts == receipt.facts
    assert (tmp_path / "cap" / "receipt.json").exists()


def test_a_record_with_a_coerced_type_is_a_journal_error(tmp_path) -> None:
    world = MemoryWorld()
    workdir = _interrupted(tmp_path, world)
    path = workdir / JOURNAL_NAME
    lines = path.read_text().splitlines()
    record = json.loads(lines[1])
    record["seq"] = "1"
    path.write_text("\n".join([lines[0], json.dumps(record), *lines[2:]]) + "\n")
    with pytest.raises(JournalError, match=":2: "):
        read_journal(path)


def test_resume_beside_a_running_operation_is_refused(tmp_path) -> None:
    world = MemoryWorld()
    first = _machine(world, tmp_path)
    gate = Gate()
    gate.hold(first.components["driver"], "launch_engine")
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(receipt=first.capture(capture_request(tmp_path)))
    )
    thread.start()
    assert gate.entered.wait(60), "the capture never started"
    with pytest.raises(_journal.WorkdirBusy, match="another coldsnap operation"):
        _machine(world, tmp_path).resume(tmp_path / "cap")
    gate.open()
    thread.join()
    assert result["receipt"].ok


def test_capture_resume_and_stop_take_the_workdir_lock(tmp_path) -> None:
    world = MemoryWorld()
    workdir = _interrupted(tmp_path, world)
    with _journal.workdir_lock(workdir):
        with pytest.raises(_journal.WorkdirBusy):
            _machine(world, tmp_path).resume(workdir)
        with pytest.raises(_journal.WorkdirBusy):
            _machine(world, tmp_path).capture(capture_request(tmp_path, workdir="cap"))
    receipt = _machine(world, tmp_path).resume(workdir)
    assert receipt.ok
    with _journal.workdir_lock(workdir), pytest.raises(_journal.WorkdirBusy):
        _machine(world, tmp_path).stop(receipt)


def test_a_receipt_with_an_unknown_or_coerced_field_is_a_journal_error(tmp_path) -> None:
    world = MemoryWorld()
    assert _machine(world, tmp_path).capture(capture_request(tmp_path)).ok
    path = tmp_path / "cap" / "receipt.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "seconds": "0.1"}))
    with pytest.raises(JournalError, match="seconds"):
        _machine(world, tmp_path).resume(tmp_path / "cap")
    path.write_text(json.dumps({**data, "colour": "blue"}))
    with pytest.raises(JournalError, match="colour"):
        _machine(world, tmp_path).resume(tmp_path / "cap")


# -- malformed journals and requests, generated ----------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from coldsnap.machine import RequestError, parse_request  # noqa: E402

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def finished_journal(tmp_path_factory) -> bytes:
    tmp = tmp_path_factory.mktemp("fuzz")
    assert _machine(MemoryWorld(), tmp).capture(capture_request(tmp)).ok
    return (tmp / "cap" / JOURNAL_NAME).read_bytes()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_damaged_journal_is_read_or_refused_with_a_journal_error(
    finished_journal: bytes, tmp_path_factory, data
) -> None:
    lines = finished_journal.splitlines(keepends=True)
    i = data.draw(st.integers(0, len(lines) - 1), label="line")
    how = data.draw(st.sampled_from(["bytes", "json", "field", "cut"]), label="how")
    if how == "bytes":
        lines[i] = data.draw(st.binary(max_size=40), label="bytes") + b"\n"
    elif how == "json":
        lines[i] = json.dumps(data.draw(_JSON, label="json")).encode() + b"\n"
    elif how == "field":
        record = json.loads(lines[i])
        key = data.draw(st.sampled_from(sorted(record)), label="key")
        record[key] = data.draw(_JSON, label="value")
        lines[i] = json.dumps(record).encode() + b"\n"
    else:
        lines[i] = lines[i][: data.draw(st.integers(0, len(lines[i]) - 1), label="cut")]
    path = tmp_path_factory.mktemp("j") / JOURNAL_NAME
    path.write_bytes(b"".join(lines))
    try:
        records = read_journal(path)
    except JournalError:
        return
    assert records[0].event == "begin"
    assert [r.seq for r in records] == list(range(len(records)))


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    field=st.sampled_from(
        [
            "driver",
            "provider",
            "model",
            "workdir",
            "store",
            "name",
            "engine",
            "engine_args",
            "tp",
            "keep_source",
            "timeouts",
            "format",
            "kind",
            "extra",
        ]
    ),
    value=_JSON,
)
def test_a_malformed_request_is_refused_naming_a_field(tmp_path_factory, field, value) -> None:
    tmp = tmp_path_factory.mktemp("req")
    (tmp / "model").mkdir()
    data = {
        "kind": "coldsnap.capture-request", "driver": "n610", "provider": "native",
        "model": {"id": "tiny", "revision": "r1", "path": str(tmp / "model")},
        "workdir": str(tmp / "cap"), "store": str(tmp / "store"), field: value,
    }  # fmt: skip
    try:
        request = parse_request(data)
    except RequestError as exc:
        assert exc.fields and all(f for f in exc.fields)
        return
    got = getattr(request, field, None)
    assert type(got) is type(value) or (isinstance(got, tuple) and isinstance(value, list)), (
        f"{field}: {value!r} was coerced to {got!r}"
    )


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    field=st.sampled_from(
        [
            "driver",
            "provider",
            "artifact",
            "model",
            "workdir",
            "store",
            "engine",
            "engine_args",
            "tp",
            "port",
            "timeouts",
            "format",
            "kind",
            "extra",
        ]
    ),
    value=_JSON,
)
def test_a_malformed_restore_request_is_refused_naming_a_field(
    tmp_path_factory, field, value
) -> None:
    tmp = tmp_path_factory.mktemp("req")
    (tmp / "model").mkdir()
    data = {
        "kind": "coldsnap.restore-request", "driver": "n610", "provider": "native",
        "artifact": "tiny", "model": {"id": "tiny", "revision": "r1", "path": str(tmp / "model")},
        "workdir": str(tmp / "res"), "store": str(tmp / "store"), field: value,
    }  # fmt: skip
    try:
        request = parse_request(data)
    except RequestError as exc:
        assert exc.fields and all(f for f in exc.fields)
        named = field if field != "extra" else "extra"
        assert any(f == named or f.startswith(named + ".") for f in exc.fields), str(exc)
        return
    got = getattr(request, field, None)
    assert (
        value is None
        or type(got) is type(value)
        or (isinstance(got, tuple) and isinstance(value, list))
    ), f"{field}: {value!r} was coerced to {got!r}"


def test_the_begin_record_keeps_each_components_capabilities(tmp_path) -> None:
    world = MemoryWorld()
    assert _machine(world, tmp_path).capture(capture_request(tmp_path)).ok
    begin = read_journal(tmp_path / "cap" / JOURNAL_NAME)[0]
    assert begin.capabilities == {
        "artifacts": [], "driver": ["cuda"], "engine": ["cuda_graphs"], "provider": ["payload"],
    }  # fmt: skip


def test_a_resume_that_would_select_other_steps_is_refused_naming_them(tmp_path) -> None:
    from coldsnap.testing import MemoryProcessDriver

    world = MemoryWorld()
    workdir = _interrupted(tmp_path, world)
    calls = len(world.calls)
    machine = _machine(world, tmp_path)
    machine.components["driver"] = MemoryProcessDriver(world, cuda=False)
    with pytest.raises(JournalError) as info:
        machine.resume(workdir)
    message = str(info.value)
    assert "left out now: cuda_lock, cuda_checkpoint; selected now, not then: none" in message
    assert "driver ['cuda'] -> []" in message
    assert len(world.calls) == calls, "nothing ran"
    assert _machine(world, tmp_path).resume(workdir).ok, "the same capabilities resume"
