"""A SourceMemo's value outlives the process through the node's record (Persisted): a new memo
(a fresh process) whose every stamp still matches takes the value without computing; anything
changed, missing, unreadable or selected by something else is computed and written again."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from attrs import frozen

from coldsnap.artifacts._sources import SOURCES_ROOT, Persisted, SourceMemo

OLD = time.time() - 3600  # written an hour ago: settled


@frozen
class Value:
    version: str
    variants: dict[str, str]


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> Value:
        self.calls += 1
        return Value(f"v{self.calls}", {"key": f"seen:{self.calls}"})


@pytest.fixture
def sources(tmp_path: Path) -> list[str]:
    folder = tmp_path / "pkg"
    folder.mkdir()
    paths = []
    for name in ("a.py", "b.py"):
        path = folder / name
        path.write_text(f"# {name}\n")
        os.utime(path, (OLD, OLD))
        paths.append(str(path))
    os.utime(folder, (OLD, OLD))
    return [*paths, str(folder)]


@pytest.fixture
def selector() -> dict[str, str]:
    return {"executable": "/usr/bin/python3", "env:SGLANG_X": "1"}


def _persisted(root: Path, selector: dict[str, str]) -> Persisted[Value]:
    return Persisted("build", lambda: dict(selector), Value, root=root)


def _fresh(
    root: Path, selector: dict[str, str], sources: list[str]
) -> tuple[SourceMemo[Value], Counting]:
    """What a new process makes: a memo with nothing kept in memory."""
    compute = Counting()
    return SourceMemo(compute, lambda: sources, persist=_persisted(root, selector)), compute


def _record(root: Path) -> Path:
    (path,) = root.glob("build-*.json")
    return path


def test_a_fresh_process_takes_the_value_from_the_record(
    tmp_path: Path, sources: list[str], selector: dict[str, str]
) -> None:
    first, computed = _fresh(tmp_path, selector, sources)
    assert first.fetch() == (Value("v1", {"key": "seen:1"}), False)
    assert first.last == "computed" and computed.calls == 1
    second, not_computed = _fresh(tmp_path, selector, sources)
    assert second.fetch() == (Value("v1", {"key": "seen:1"}), True)
    assert second.last == "record" and not_computed.calls == 0
    assert second.fetch() == (Value("v1", {"key": "seen:1"}), True)  # kept, still the record's
    assert second.last == "memory"


def test_the_record_is_private_to_root_and_names_what_it_holds(
    tmp_path: Path, sources: list[str], selector: dict[str, str]
) -> None:
    memo, _ = _fresh(tmp_path / "sources", selector, sources)
    memo()
    record = _record(tmp_path / "sources")
    assert (tmp_path / "sources").stat().st_mode & 0o777 == 0o700
    data = json.loads(record.read_text())
    assert (data["format"], data["kind"], data["name"]) == (1, "coldsnap.source-memo", "build")
    assert data["selector"] == selector
    assert data["value"] == {"version": "v1", "variants": {"key": "seen:1"}}
    assert sorted(f["path"] for f in data["seen"]) == sorted(sources)
    assert [p.name for p in (tmp_path / "sources").iterdir()] == [record.name]  # no leftovers


@pytest.mark.parametrize("change", ["rewrite", "touch", "add_module", "remove"])
def test_a_changed_source_is_computed_again_and_the_record_rewritten(
    tmp_path: Path, sources: list[str], selector: dict[str, str], change: str
) -> None:
    root = tmp_path / "records"
    _fresh(root, selector, sources)[0]()
    a = Path(sources[0])
    if change == "rewrite":
        a.write_text("x = 100\n")
        os.utime(a, (OLD, OLD))  # even with its time put back: the size differs
    elif change == "touch":
        os.utime(a)
    elif change == "add_module":
        (Path(sources[2]) / "c.py").write_text("z = 3\n")  # the folder's mtime moves
    else:
        a.unlink()
    memo, compute = _fresh(root, selector, sources)
    assert memo.fetch() == (Value("v1", {"key": "seen:1"}), False) and compute.calls == 1
    if change != "rewrite":
        return  # a file or folder written just now: not settled, nothing recorded (next test)
    again, not_computed = _fresh(root, selector, sources)
    assert again.fetch()[1] and not_computed.calls == 0  # the rewritten record serves


def test_sources_written_just_before_leave_no_record(
    tmp_path: Path, selector: dict[str, str]
) -> None:
    fresh = tmp_path / "fresh.py"
    fresh.write_text("x = 1\n")
    memo, _ = _fresh(tmp_path / "records", selector, [str(fresh)])
    memo()
    assert not (tmp_path / "records").exists()


def test_another_selector_does_not_use_the_record(
    tmp_path: Path, sources: list[str], selector: dict[str, str]
) -> None:
    _fresh(tmp_path, selector, sources)[0]()
    other = {**selector, "env:SGLANG_X": "2"}
    memo, compute = _fresh(tmp_path, other, sources)
    assert memo.fetch()[1] is False and compute.calls == 1
    assert len(list(tmp_path.glob("build-*.json"))) == 2  # one record per selector


def test_a_record_naming_another_selector_is_not_used(
    tmp_path: Path, sources: list[str], selector: dict[str, str]
) -> None:
    """The file name is a digest of the selector; the selector inside must match too."""
    _fresh(tmp_path, selector, sources)[0]()
    record = _record(tmp_path)
    data = json.loads(record.read_text())
    data["selector"]["env:SGLANG_X"] = "2"
    record.write_text(json.dumps(data))
    memo, compute = _fresh(tmp_path, selector, sources)
    assert memo.fetch()[1] is False and compute.calls == 1


@pytest.mark.parametrize(
    "damage",
    ["garbage", "empty", "list", "format", "kind", "extra_key", "value_type", "stamp_type"],
)
def test_an_unusable_record_is_computed_again_and_rewritten(
    tmp_path: Path, sources: list[str], selector: dict[str, str], damage: str
) -> None:
    _fresh(tmp_path, selector, sources)[0]()
    record = _record(tmp_path)
    data = json.loads(record.read_text())
    if damage == "garbage":
        text = "{not json"
    elif damage == "empty":
        text = ""
    elif damage == "list":
        text = "[]"
    else:
        if damage == "format":
            data["format"] = 2
        elif damage == "kind":
            data["kind"] = "coldsnap.verified-object"
        elif damage == "extra_key":
            data["trusted"] = True
        elif damage == "value_type":
            data["value"]["version"] = 5
        else:
            data["seen"][0]["ino"] = "5"
        text = json.dumps(data)
    record.write_text(text)
    memo, compute = _fresh(tmp_path, selector, sources)
    assert memo.fetch() == (Value("v1", {"key": "seen:1"}), False) and compute.calls == 1
    assert json.loads(record.read_text())["format"] == 1  # rewritten whole
    again, not_computed = _fresh(tmp_path, selector, sources)
    assert again.fetch()[1] and not_computed.calls == 0


def test_an_unreadable_record_is_computed_again(
    tmp_path: Path, sources: list[str], selector: dict[str, str]
) -> None:
    _fresh(tmp_path, selector, sources)[0]()
    record = _record(tmp_path)
    record.unlink()
    record.mkdir()  # read_bytes fails with an OSError, and so does the rewrite
    memo, compute = _fresh(tmp_path, selector, sources)
    assert memo() == Value("v1", {"key": "seen:1"}) and compute.calls == 1


def test_a_root_that_cannot_be_written_costs_only_the_computation(
    tmp_path: Path, sources: list[str], selector: dict[str, str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    memo, compute = _fresh(blocker / "records", selector, sources)
    assert [memo(), memo()] == [Value("v1", {"key": "seen:1"})] * 2 and compute.calls == 1


def test_a_failed_computation_writes_nothing(
    tmp_path: Path, sources: list[str], selector: dict[str, str]
) -> None:
    def failing() -> Value:
        raise RuntimeError("contract check failed")

    root = tmp_path / "records"
    memo = SourceMemo(failing, lambda: sources, persist=_persisted(root, selector))
    with pytest.raises(RuntimeError, match="contract check failed"):
        memo()
    assert not root.exists()


def test_the_default_root_is_read_when_used(
    tmp_path: Path, sources: list[str], selector: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under /run (forgotten at reboot, beside the verified-object records); tests and tools
    point it elsewhere by the module's SOURCES_ROOT."""
    from coldsnap.artifacts import _sources

    assert Path("/run/coldsnap/sources") == SOURCES_ROOT
    monkeypatch.setattr(_sources, "SOURCES_ROOT", tmp_path / "moved")
    memo = SourceMemo(Counting(), lambda: sources, persist=Persisted("build", dict, Value))
    memo()
    assert len(list((tmp_path / "moved").glob("build-*.json"))) == 1


def test_another_users_record_is_not_used(
    tmp_path: Path, sources: list[str], selector: dict[str, str]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    _fresh(tmp_path, selector, sources)[0]()
    os.chown(_record(tmp_path), 65534, 65534)  # nobody's
    memo, compute = _fresh(tmp_path, selector, sources)
    assert memo.fetch()[1] is False and compute.calls == 1
    assert _record(tmp_path).stat().st_uid == os.geteuid()  # rewritten as this user's
