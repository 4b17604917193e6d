"""The suite's own rules that a reader cannot see from one file: every module that needs the
host (a test marked `criu`, `sglang` or `gpu`) is in one of xdist's two host groups, so that
`make test` runs each group on one worker, one test after another: "host" for SGLang servers
and GPUs, "toys" for CRIU on small toy processes, which starts no SGLang server
(tests/conftest.py says why the two may run side by side)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import SERVER_GROUP

TESTS = Path(__file__).resolve().parent
HOST_MARKS = {"criu", "sglang", "gpu"}
GROUPS = ("host", "toys")


def _marks_used(tree: ast.Module) -> set[str]:
    """Names `x` of every `pytest.mark.x` the module mentions."""
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "pytest"
    }


def _module_groups(tree: ast.Module) -> set[str]:
    """The groups of every `pytest.mark.xdist_group(NAME)` in the module's own `pytestmark`."""
    groups: set[str] = set()
    for stmt in tree.body:
        if not (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets)
        ):
            continue
        for node in ast.walk(stmt.value):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "xdist_group"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                groups.add(str(node.args[0].value))
    return groups


def test_every_module_that_needs_the_host_is_in_the_host_group() -> None:
    modules = sorted(TESTS.rglob("test_*.py"))
    assert len(modules) > 50  # the walk found the suite
    forgotten, seen = [], 0
    for path in modules:
        tree = ast.parse(path.read_text(), str(path))
        marks = _marks_used(tree) & HOST_MARKS
        if not marks:
            continue
        seen += 1
        if len(set(GROUPS) & _module_groups(tree)) != 1:
            forgotten.append(f"{path.relative_to(TESTS)} (marks {', '.join(sorted(marks))})")
    assert seen > 10  # the suite's host-bound modules were recognised
    assert not forgotten, (
        f"add one of the groups {GROUPS} (pytest.mark.xdist_group) to the module's "
        "pytestmark: " + "; ".join(forgotten)
    )


def test_servers_and_gpus_are_only_in_the_server_group() -> None:
    """A module that starts SGLang (or uses a GPU) beside the other server modules would run two
    servers at once on a 2-core host: only CRIU toys may leave the server group."""
    misplaced = []
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        heavy = _marks_used(tree) & {"sglang", "gpu"}
        if heavy and SERVER_GROUP not in _module_groups(tree):
            misplaced.append(f"{path.relative_to(TESTS)} (marks {', '.join(sorted(heavy))})")
    assert not misplaced, f'these belong in xdist_group("{SERVER_GROUP}"): ' + "; ".join(misplaced)


def test_the_check_reads_marks_and_groups() -> None:
    """The two readers above on a module that uses a host mark with and without the group."""
    marked = ast.parse("import pytest\n@pytest.mark.criu\ndef test_x(): pass\n")
    grouped = ast.parse('import pytest\npytestmark = [pytest.mark.xdist_group("host")]\n')
    assert _marks_used(marked) == {"criu"}
    assert _module_groups(marked) == set()
    assert _module_groups(grouped) == {"host"}


def test_only_the_server_group_runs_at_the_normal_priority() -> None:
    """conftest's `nice_for`: the server group at 0, every other test (a toy, an in-memory test)
    at the background priority, whichever way the group is given."""
    import pytest

    from tests.conftest import BACKGROUND_NICE, nice_for

    class Item:
        def __init__(self, *marks: pytest.Mark) -> None:
            self.marks = {m.name: m for m in marks}

        def get_closest_marker(self, name: str) -> pytest.Mark | None:
            return self.marks.get(name)

    assert BACKGROUND_NICE > 0
    assert nice_for(Item(pytest.mark.xdist_group(SERVER_GROUP).mark)) == 0  # type: ignore[arg-type]
    assert nice_for(Item(pytest.mark.xdist_group(name=SERVER_GROUP).mark)) == 0  # type: ignore[arg-type]
    for other in (Item(pytest.mark.xdist_group("toys").mark), Item(pytest.mark.slow.mark), Item()):
        assert nice_for(other) == BACKGROUND_NICE  # type: ignore[arg-type]
