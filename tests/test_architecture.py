"""docs/architecture.md's import table is the rule: every module under coldsnap/ imports only its
own room and the rooms its row may use, read from the source (ast; nothing is imported), and no
product module imports the test kit (`coldsnap.testing`)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "coldsnap"
DOC = REPO / "docs" / "architecture.md"
KIT = "coldsnap.testing"


def parse_table(text: str) -> dict[str, set[str]]:
    """Rooms and what each may use, from the markdown table whose header is
    `| room | holds | may use |`. A room cell names one or more modules in backticks
    (`coldsnap.engines.sglang`); a may-use cell lists backticked module names, or says
    "nothing of ours"; words outside backticks are the reader's notes."""
    lines = iter(text.splitlines())
    for line in lines:
        if re.fullmatch(r"\|\s*room\s*\|\s*holds\s*\|\s*may use\s*\|", line.strip()):
            break
    else:
        raise AssertionError("no `| room | holds | may use |` table")
    next(lines)  # the |---| row
    rooms: dict[str, set[str]] = {}
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3:
            raise AssertionError(f"a row of three cells expected: {line}")
        names = re.findall(r"`([\w.]+)`", cells[0])
        uses = set(re.findall(r"`([\w.]+)`", cells[2]))
        if not names or (not uses and "nothing of ours" not in cells[2]):
            raise AssertionError(f"a row without rooms or without what they may use: {line}")
        for name in names:
            if name in rooms:
                raise AssertionError(f"room {name} listed twice")
            rooms[name] = uses
    return rooms


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every import of ours in a source file, lazy ones included: a
    `from P import n` counts as importing `P.n` where that is a module, else `P`."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "coldsnap" or alias.name.startswith("coldsnap."):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = package.split(".")
                base = ".".join(parent[: len(parent) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            if not (source == "coldsnap" or source.startswith("coldsnap.")):
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                yield node.lineno, full if _is_module(full) else source


def room_of(module: str, rooms: dict[str, set[str]]) -> str | None:
    """The longest room that holds `module`. A room holds itself and its submodules, but the
    top package (`coldsnap`) only itself: a new package must get its own row."""
    best = None
    for room in rooms:
        holds = module == room or ("." in room and module.startswith(room + "."))
        if holds and (best is None or len(room) > len(best)):
            best = room
    return best


def violations(rooms: dict[str, set[str]]) -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = module_name(path)
        mine = room_of(here, rooms)
        if mine is None:
            found.append(f"{here}: in no room of the table")
            continue
        for line, target in imports_of(path):
            theirs = room_of(target, rooms)
            if theirs is None:
                found.append(f"{here}:{line} imports {target}, which is in no room")
            elif theirs != mine and theirs not in rooms[mine]:
                found.append(f"{here}:{line} imports {target} ({theirs}): {mine} may not use it")
    return found


def test_every_import_is_one_the_table_allows() -> None:
    rooms = parse_table(DOC.read_text())
    assert "coldsnap.machine" in rooms and len(rooms) > 10  # the table was found and read
    problems = violations(rooms)
    assert not problems, "\n".join(problems)


def test_no_product_module_imports_the_test_kit() -> None:
    users = [
        f"{module_name(path)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if not module_name(path).startswith(KIT)
        for line, target in imports_of(path)
        if target == KIT or target.startswith(KIT + ".")
    ]
    assert not users, f"the product imports {KIT}: {', '.join(users)}"


def test_the_table_reader_and_the_checker_find_a_forbidden_import(tmp_path: Path) -> None:
    """The checker on a table that forbids what the code does: it must say so."""
    table = (
        "| room | holds | may use |\n|---|---|---|\n"
        "| `coldsnap.machine` | the core | `coldsnap._errors` |\n"
        "| `coldsnap._errors`, `coldsnap._atomic` | leaves | nothing of ours |\n"
    )
    rooms = parse_table(table)
    assert rooms == {
        "coldsnap.machine": {"coldsnap._errors"},
        "coldsnap._errors": set(),
        "coldsnap._atomic": set(),
    }
    assert room_of("coldsnap.machine._steps", rooms) == "coldsnap.machine"
    problems = violations(rooms)
    assert any("coldsnap.drivers" in p and "in no room" in p for p in problems)
    with pytest.raises(AssertionError, match="without rooms or without what they may use"):
        parse_table("| room | holds | may use |\n|---|---|---|\n| `a` | x | anything |\n")
