"""`coldsnap capture` on a host whose configured CRIU is not there: one line naming the path and
what was found, exit 5, and nothing started or journaled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from coldsnap.backends import Criu
from coldsnap.cli import main
from coldsnap.drivers.n610 import N610Driver
from coldsnap.machine import Machine
from coldsnap.testing import MemoryWorld
from tests.machine._lifecycle import lifecycle_registry


def _request_file(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    path = tmp_path / "req.json"
    path.write_text(json.dumps({
        "kind": "coldsnap.capture-request", "driver": "n610", "provider": "native",
        "model": {"id": "tiny", "revision": "r1", "path": str(tmp_path / "model")},
        "workdir": str(tmp_path / "op"), "store": str(tmp_path / "store"),
    }))  # fmt: skip
    return path


def test_capture_without_criu_says_so_and_exits_5(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "criu-bundle" / "criu"
    registry = lifecycle_registry(MemoryWorld())

    def for_request(request: Any, **kw: Any) -> Machine:
        """The memory doubles, with the real driver (no launcher: a step that ran would fail
        at once rather than start a process) and its CRIU at a path that does not exist."""
        components = registry.components(request).by_role()
        driver = N610Driver(launcher=None, criu=Criu(missing))  # type: ignore[arg-type]
        return Machine(**{**components, "driver": driver}, registry=registry, **kw)

    monkeypatch.setattr("os.geteuid", lambda: 0)  # root is asked first (the command line too)
    monkeypatch.setattr(Machine, "for_request", staticmethod(for_request))
    result = CliRunner().invoke(main, ["capture", str(_request_file(tmp_path))])
    assert result.exit_code == 5, result.output + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.stderr
    assert lines[0].startswith("coldsnap: this host cannot run the capture, nothing was started")
    assert f"CRIU >= 4.2 at {missing} (driver 'n610')" in lines[0]
    assert "No such file or directory" in lines[0]
    assert not (tmp_path / "op").exists()
