"""What makes an n580 capture and restore start faster (bench/bench_n580.py): the
template's forkserver imports beside the template instead of after it, and a restored engine
skips SGLang's server warmup (its acceptance request proves generation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from coldsnap._atomic import write_json_atomic
from coldsnap.drivers.n580._template import RELEASE, STATUS
from coldsnap.engines.sglang import SGLangLauncher
from coldsnap.machine import WeightSource

REPO = Path(__file__).resolve().parents[2]


def _modules(root: Path) -> None:
    """`tpl_waits` (the template's preload) returns only once `fs_marks` (the forkserver's) has
    been imported in the forkserver: a forkserver started after the template's imports would
    never let it return."""
    (root / "fs_marks.py").write_text(
        "import os, pathlib\npathlib.Path(os.environ['HANDSHAKE']).write_text(str(os.getpid()))\n"
    )
    (root / "tpl_waits.py").write_text(
        textwrap.dedent(
            """
            import os, pathlib, time
            mark = pathlib.Path(os.environ["HANDSHAKE"])
            deadline = time.monotonic() + 60
            while not mark.exists():
                if time.monotonic() > deadline:
                    raise SystemExit("the forkserver had not imported its modules")
                time.sleep(0.01)
            """
        )
    )
    (root / "done.py").write_text("")


def _wait_state(control: Path, state: str, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            status = json.loads((control / STATUS).read_text())
        except (OSError, ValueError):
            status = {}
        if status.get("state") == state:
            return status
        assert proc.poll() is None, f"the template ended early: {proc.stdout.read()!r}"  # type: ignore[union-attr]
        time.sleep(0.02)
    raise AssertionError(f"the template did not reach {state!r}")


def test_the_forkserver_imports_beside_the_templates_own_imports(tmp_path: Path) -> None:
    _modules(tmp_path)
    control, handshake = tmp_path / "control", tmp_path / "handshake"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}",
        "HANDSHAKE": str(handshake),
    }
    argv = [sys.executable, "-m", "coldsnap.drivers.n580._template", "--control", str(control),
            "--preload", "tpl_waits", "--forkserver-preload", "fs_marks"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    try:
        status = _wait_state(control, "waiting", proc)
        assert status["forkserver_address"]
        assert int(handshake.read_text()) not in (proc.pid, 0)  # imported in another process
        # atomically, as the driver does: the template reads the file as soon as it exists
        write_json_atomic(control / RELEASE, {"module": "done", "args": [], "env": {}})
        _wait_state(control, "released", proc)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _request(operation: str, engine_args: tuple[str, ...] = ()) -> Any:
    return SimpleNamespace(
        operation=operation, model=SimpleNamespace(path="/models/m"), tp=None,
        engine_args=engine_args,
    )  # fmt: skip


def test_a_restored_engine_skips_sglangs_warmup_and_a_captured_one_keeps_it(
    tmp_path: Path,
) -> None:
    launcher = SGLangLauncher(("--device", "cpu"), cpu=True)
    payload = WeightSource(source="payload", payload_dir=str(tmp_path / "payload"))
    restored = launcher.command(_request("restore"), tmp_path, weights=payload)
    assert restored.argv.count("--skip-server-warmup") == 1
    captured = launcher.command(
        _request("capture"), tmp_path, weights=WeightSource(source="payload")
    )
    assert "--skip-server-warmup" not in captured.argv
    checkpoint = WeightSource(source="checkpoint", checkpoint=str(tmp_path / "model"))
    asked = launcher.command(_request("restore", ("--skip-server-warmup",)), tmp_path,
                             weights=checkpoint)  # fmt: skip
    assert asked.argv.count("--skip-server-warmup") == 1
