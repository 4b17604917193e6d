"""Issue 16's campaign over records read from disk: a capsule manifest (identity included), a
capture record and a tag record, each damaged at a generated place (a value replaced by any JSON
value, a key removed or added, the bytes garbled), is read back as a valid record or refused with
a RecordError that names the damaged field (or one above or below it), never a raw KeyError,
TypeError or UnicodeDecodeError."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coldsnap.artifacts import Capsule, Member, RecordError, from_json, to_json
from coldsnap.artifacts._capsule import TagRecord
from coldsnap.capsules import CaptureRecord, read_record

from .conftest import _make_identity

SHA = "sha256:" + "cd" * 32
Path_ = tuple[str | int, ...]

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _capsule() -> dict[str, Any]:
    member = Member("process-image", "image/pages-1.img", SHA, 5, blocks=("ab" * 32,))
    record = Member("record", "capture.json", "sha256:" + "ef" * 32, 9)
    capsule = Capsule(members=(member, record), identity=_make_identity())
    return json.loads(to_json(capsule))


def _capture_record() -> dict[str, Any]:
    record = CaptureRecord(
        driver="n610", provider="native", engine="sglang", model_id="org/m", revision="r1",
        facts={"engine_url": "http://127.0.0.1:1"}, engine_args=("--dtype", "float16"),
    )  # fmt: skip
    return json.loads(to_json(record))


def _tag() -> dict[str, Any]:
    return json.loads(to_json(TagRecord(tag="tiny", capsule=SHA)))


READERS: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[Any], Any]]] = {
    "capsule": (_capsule, lambda data: from_json(data, Capsule)),
    "capture-record": (_capture_record, read_record),
    "tag": (_tag, lambda data: from_json(data, TagRecord)),
}


def _paths(value: Any, at: Path_ = ()) -> Iterator[Path_]:
    yield at
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*at, i))


def _name(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _related(field: str, damaged: str) -> bool:
    """The error names the damaged field, a record above it or a field below it."""
    if field in ("$", "") or not damaged:
        return True
    return any(
        a == b or b.startswith(a + ".") or b.startswith(a + "[")
        for a, b in ((field, damaged), (damaged, field))
    )


def _at(data: Any, path: Path_) -> Any:
    for part in path:
        data = data[part]
    return data


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(sorted(READERS)), data=st.data())
def test_a_damaged_record_is_read_or_refused_naming_the_field(which: str, data) -> None:
    build, read = READERS[which]
    record = build()
    path = data.draw(st.sampled_from(list(_paths(record))), label="path")
    how = data.draw(st.sampled_from(["replace", "remove", "add"]), label="how")
    if how == "replace" or not path:
        value = data.draw(_JSON, label="value")
        if not path:
            record = value
        else:
            _at(record, path[:-1])[path[-1]] = value
    elif how == "remove":
        parent = _at(record, path[:-1])
        del parent[path[-1]]
    else:
        target = _at(record, path)
        if not isinstance(target, dict):
            return
        key = data.draw(st.text(min_size=1, max_size=6), label="key")
        if key in target:
            return
        target[key] = data.draw(_JSON, label="extra")
    try:
        read(json.dumps(record))
    except RecordError as exc:
        assert exc.fields and all(isinstance(f, str) for f in exc.fields)
        damaged = _name(path)
        assert any(_related(f, damaged) for f in exc.fields), (damaged, str(exc))


@settings(max_examples=150, deadline=None)
@given(which=st.sampled_from(sorted(READERS)), garbage=st.binary(max_size=64))
def test_garbled_bytes_are_refused_as_a_record_error(which: str, garbage: bytes) -> None:
    build, read = READERS[which]
    text = json.dumps(build()).encode()
    for damaged in (garbage, text[: len(text) // 2], text + garbage, b"\xff" + text):
        try:
            read(damaged)
        except RecordError as exc:
            assert exc.fields
        else:
            assert damaged == text + garbage and garbage.strip() == b""


@pytest.mark.parametrize("which", sorted(READERS))
def test_a_wrong_kind_is_named_first(which: str) -> None:
    build, read = READERS[which]
    with pytest.raises(RecordError) as info:
        read(json.dumps({**build(), "kind": "coldsnap.other"}))
    assert info.value.fields == ("kind",)
