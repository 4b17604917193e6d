"""The status record the plugin writes per process, read as one typed record
(coldsnap._wire.ProcessStatus): what the plugin writes parses, every field it can write is
declared, and a record that is not the plugin's is refused naming the field."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from coldsnap._wire import (
    STATUS_FIELDS,
    ProcessStatus,
    RankResume,
    ReleaseReport,
    StatusError,
    parse_status,
    read_status,
    status_path,
)
from coldsnap.plugin import StatusFile

PLUGIN = Path(__file__).resolve().parents[2] / "coldsnap" / "plugin"
BASE = {"role": "scheduler", "mode": "capture", "tp_rank": 0, "tp_size": 1, "pp_rank": 0,
        "dp_rank": None, "contract_digest": "sha256:c", "contract_variants": {"k": "0.5:v"},
        "plugin_digest": "sha256:p"}  # fmt: skip


def test_what_the_plugin_writes_reads_back_typed(tmp_path: Path) -> None:
    status = StatusFile(tmp_path, "scheduler-tp0", BASE)
    status.update("hooks_landed", hooks=["a.b"])
    status.update("registered", registered={"target": {"tensors": 3}})
    status.update(
        "cuda_release_measured",
        cuda_release={
            "at": 1.0,
            "tags": ["weights"],
            "device": "cpu",
            "error": None,
            "regions": {},
            "resident": {},
            "residual_device_bytes": 0,
            "host_cache": None,
        },
    )
    status.update("released", operation="op-1", outcome="ok", error=None,
                  released_tags=["kv_cache", "weights"], discarded_bytes=4, export=None,
                  nccl=None, residual="off")  # fmt: skip
    status.update(
        "resumed",
        operation="op-2",
        outcome="ok",
        released_tags=[],
        resume={
            "source": "payload",
            "nccl": None,
            "hydrated": {"target": {}},
            "storages_unchanged": True,
            "seconds": 0.5,
        },
    )
    status.update(None, barrier_waited_s=0.01)
    record = read_status(status_path(tmp_path, "scheduler-tp0"))
    assert isinstance(record, ProcessStatus) and record.process == "scheduler-tp0"
    assert record.last_event == "resumed" and record.events[0].fields == {"hooks": ["a.b"]}
    assert record.released_tags == () and record.hooks == ("a.b",)
    assert isinstance(record.cuda_release, ReleaseReport) and record.cuda_release.tags == (
        "weights",
    )
    assert isinstance(record.resume, RankResume) and record.resume.source == "payload"


def _written_fields() -> set[str]:
    """Every field name the plugin passes to its status record's update (directly, or through
    the scheduler's `_report`)."""
    names: set[str] = set()
    for path in PLUGIN.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            target = ast.unparse(node.func.value)
            if (node.func.attr, target) not in (
                ("update", "self.status"),
                ("update", "status"),
                ("_report", "self"),
            ):
                continue
            names |= {kw.arg for kw in node.keywords if kw.arg}
    return names


def test_every_field_the_plugin_writes_is_declared() -> None:
    written = _written_fields()
    assert {"operation", "outcome", "released_tags", "resume", "gate"} <= written  # found them
    # written through a name or a mapping: the release report's field, the kept state
    written |= {"cuda_release", "residual", "spilled", *BASE}
    assert written - set(STATUS_FIELDS) == set()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"surprise": 1}, "surprise"),
        ({"pid": "12"}, "pid"),
        ({"released_tags": "weights"}, "released_tags"),
        ({"format": 9}, "format"),
        ({"kind": "other"}, "kind"),
        ({"cuda_release": {"at": 1.0, "resident": {}, "extra": 1}}, "extra"),
        ({"resume": {"hydrated": []}}, "hydrated"),
        ({"events": [{"event": "x"}]}, "events[0]"),
    ],
)
def test_a_record_that_is_not_the_plugins_is_refused_naming_the_field(
    change: dict[str, object], field: str
) -> None:
    record = {"format": 1, "kind": "coldsnap.sglang.process-status", "process": "main",
              "pid": 7, **BASE, **change}  # fmt: skip
    with pytest.raises(StatusError, match=re.escape(field)):
        parse_status(record, where="status record main")


def test_a_missing_field_is_named_and_an_absent_record_is_the_callers(tmp_path: Path) -> None:
    with pytest.raises(StatusError, match="pid"):
        parse_status({"format": 1, "kind": "coldsnap.sglang.process-status", "process": "main",
                      "role": "main", "mode": "off"})  # fmt: skip
    with pytest.raises(FileNotFoundError):
        read_status(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(StatusError, match=r"bad\.json is unreadable"):
        read_status(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text(json.dumps([1]))
    with pytest.raises(StatusError, match="expected an object"):
        read_status(tmp_path / "list.json")
