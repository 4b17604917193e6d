"""A command's process skips the interpreter's garbage collection at exit: every object is
frozen by an atexit hook the command registers once (the collections cost 0.1-0.15 s of a fresh
`coldsnap restore` on a 2-core host)."""

from __future__ import annotations

import atexit
import gc
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from coldsnap.cli import main


def test_a_command_freezes_its_objects_at_exit_once(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[Callable[..., Any]] = []

    def register(hook: Callable[..., Any]) -> Callable[..., Any]:
        registered.append(hook)
        return hook

    def unregister(hook: Callable[..., Any]) -> None:
        while hook in registered:
            registered.remove(hook)

    monkeypatch.setattr(atexit, "register", register)
    monkeypatch.setattr(atexit, "unregister", unregister)
    runner = CliRunner()
    for _ in range(2):
        done = runner.invoke(main, ["schema", "restore"])
        assert done.exit_code == 0, done.output
    assert registered == [gc.freeze]
