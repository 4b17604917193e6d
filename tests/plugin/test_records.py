"""Files shared with the orchestrator: status records and the resume plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coldsnap._wire import (
    PLAN_FILE,
    PLAN_KIND,
    STATUS_KIND,
    PlanError,
    ResumePlan,
    read_plan,
    status_path,
    write_plan,
)
from coldsnap.plugin import StatusFile


def test_status_record_is_versioned_and_atomic(tmp_path: Path) -> None:
    st = StatusFile(tmp_path, "scheduler-tp0", {"role": "scheduler"})
    st.update("released", operation="op1", outcome="ok")
    st.update("resumed", operation="op2", outcome="ok")
    record = json.loads(status_path(tmp_path, "scheduler-tp0").read_text())
    assert record["format"] == 1 and record["kind"] == STATUS_KIND
    assert record["operation"] == "op2"
    assert [e["event"] for e in record["events"]] == ["released", "resumed"]
    assert not [p for p in (tmp_path / "sglang").iterdir() if p.name.startswith(".")]


def test_status_without_runtime_dir_writes_nothing(tmp_path: Path) -> None:
    st = StatusFile(None, "main", {})
    st.update("x", a=1)
    assert st.record["a"] == 1


def test_plan_round_trip(tmp_path: Path) -> None:
    plan = ResumePlan(source="checkpoint", checkpoint="/ckpt", draft_checkpoint="/draft")
    path = write_plan(tmp_path, plan)
    assert path == tmp_path / PLAN_FILE
    assert json.loads(path.read_text())["kind"] == PLAN_KIND
    assert read_plan(tmp_path) == plan


def test_missing_plan_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"no resume plan at .*source payload or checkpoint"):
        read_plan(tmp_path)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"source": "magic"}, "source"),
        ({"source": "payload"}, "payload_dir"),
        ({"source": "checkpoint"}, "checkpoint"),
        ({"source": "payload", "payload_dir": "rel/dir"}, "payload_dir"),
        ({"source": "payload", "payload_dir": "/p", "kind": "other"}, "kind"),
        ({"source": "payload", "payload_dir": "/p", "format": 9}, "format"),
    ],
)
def test_bad_plan_names_the_field(tmp_path: Path, data: dict[str, object], field: str) -> None:
    record = {"format": 1, "kind": PLAN_KIND, **data}
    (tmp_path / PLAN_FILE).write_text(json.dumps(record))
    with pytest.raises(PlanError, match=f"field '{field}'"):
        read_plan(tmp_path)


def test_plan_with_unknown_field_or_not_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / PLAN_FILE).write_text(
        json.dumps({"source": "payload", "payload_dir": "/p", "x": 1})
    )
    with pytest.raises(PlanError, match="malformed"):
        read_plan(tmp_path)
    (tmp_path / PLAN_FILE).write_text("{")
    with pytest.raises(PlanError, match="not JSON"):
        read_plan(tmp_path)


def test_write_plan_refuses_a_bad_plan_before_writing(tmp_path: Path) -> None:
    with pytest.raises(PlanError):
        write_plan(tmp_path, ResumePlan(source="payload"))
    assert not (tmp_path / PLAN_FILE).exists()


def test_the_plan_carries_the_kinds_of_weight_source_the_machine_knows() -> None:
    """The two sides never import each other: the resume plan's `source` values and the
    machine's WeightSource kinds are spelled twice, and must stay the same."""
    from coldsnap import _wire
    from coldsnap.machine import _launch

    assert set(_wire.SOURCES) == set(_launch.SOURCES)
