"""n610 starts its engine under the launcher's holder: the tree it dumps has a small root, so a
restore reads the engine's processes' memory all at once (CRIU restores the root's own memory
only after every other task's)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from coldsnap.backends.procs import tree_pids
from coldsnap.drivers.n610 import N610Driver
from coldsnap.drivers.n610 import _driver as n610_driver
from coldsnap.machine import LaunchCommand

_ENGINE = "import time; print('engine up', flush=True); time.sleep(60)"


def test_the_engine_runs_under_a_small_root(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(n610_driver, "launch_weights", lambda ctx: None)
    command = LaunchCommand(argv=(sys.executable, "-c", _ENGINE), url="http://127.0.0.1:1")
    launcher = SimpleNamespace(command=lambda request, workdir, weights: command)
    driver = N610Driver(launcher=launcher)  # type: ignore[arg-type]
    recorded: dict[str, Any] = {}
    ctx = SimpleNamespace(
        request=SimpleNamespace(operation="capture"),
        workdir=tmp_path,
        facts={},
        record=recorded.update,
    )
    facts = driver.launch_engine(ctx)  # type: ignore[arg-type]
    root = facts["engine_pid"]
    try:
        deadline = time.monotonic() + 10.0
        while "engine up" not in (tmp_path / "engine.log").read_text():
            assert time.monotonic() < deadline, (tmp_path / "engine.log").read_text()
            time.sleep(0.01)
        members = tree_pids(root)
        assert len(members) == 2, members
        assert b"--hold" in Path(f"/proc/{root}/cmdline").read_bytes()
        assert _ENGINE.encode() in Path(f"/proc/{members[1]}/cmdline").read_bytes()
        assert recorded["engine_pid"] == root
    finally:
        driver.processes.stop(root, timeout=5.0)
    assert not Path(f"/proc/{root}").exists()
