"""`coldsnap restore` in a new process imports neither SGLang nor torch on a CPU host: the
engine's build is checked by the source files the capsule names (hashed where the import path
finds them), the platform by torch's version file. The command is spawned as an operator runs
it, on a capsule sealed with the installed SGLang's files, and what it imported is read at its
exit; its restore ends at the snapshot driver (the image is no real process), after admit."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coldsnap import _torch
from coldsnap.artifacts import sha256_file
from coldsnap.capsules import StoreArtifacts
from coldsnap.engines.sglang import SGLangCommandLine
from coldsnap.engines.sglang import _build as sglang_build
from coldsnap.machine import InstalledBuild
from coldsnap.machine import steps as s
from tests._support import missing
from tests.capsules.test_store_steps import Ctx

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("host")]  # runs the CRIU driver

SOURCES = ("sglang/srt/managers/scheduler.py", "sglang/srt/model_executor/model_runner.py")
HEAVY = ("sglang", "torch", "sgl_kernel")
LIGHT_ONLY = ("yaml", "huggingface_hub.file_download", "rich", "pygments")
"""What a restore by name does without: the recipes' YAML, the Hub's download module (the
cache's folder for the capsule's model is named without it), and with `--json` the terminal's
libraries (rich, and pygments, which httpx's own command-line client would bring)."""
AUDIT = """
import atexit, json, sys
atexit.register(lambda: print("IMPORTED " + json.dumps(sorted(
    n for n in sys.modules
    if n.split(".")[0] in ("sglang", "torch", "sgl_kernel", "yaml", "rich", "pygments")
    or n == "huggingface_hub.file_download"
)), file=sys.stderr))
from coldsnap.cli import main
sys.argv[0] = "coldsnap"
main()
"""


class Installed(SGLangCommandLine):
    """The SGLang adapter's launch-line policy, with the build of the installed SGLang as a
    capture records it (two of its files), taken without importing it."""

    name = "sglang"
    capabilities: frozenset[str] = frozenset()

    def build(self, recorded: InstalledBuild | None = None) -> InstalledBuild:
        assert recorded is None
        files = {key: sglang_build._locate(key) for key in SOURCES}
        return InstalledBuild(
            engine="sglang",
            version=importlib.metadata.version("sglang"),
            contract="sha256:" + "c0" * 32,
            plugin_digest="sha256:" + "d0" * 32,
            sources={key: sha256_file(path) for key, path in files.items() if path},
        )


def _capsule(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    image = tmp_path / "op" / "image"
    image.mkdir(parents=True)
    (image / "core-1.img").write_bytes(b"not a process")
    request = SimpleNamespace(
        driver="n610",
        provider="native",
        engine="sglang",
        name="cap",
        tp=1,
        store=str(tmp_path / "store"),
        model=SimpleNamespace(id="org/toy", revision="r1", path=str(model)),
        engine_args=(),
        engine_options={},
    )
    facts: dict[str, Any] = {
        s.ENGINE_URL.name: "http://127.0.0.1:1234",
        s.IMAGE_DIR.name: str(image),
        s.IMAGE_BYTES.name: 13,
    }
    StoreArtifacts(Installed()).seal(Ctx(request, tmp_path / "op", facts, s.SEAL))  # type: ignore[arg-type]
    return tmp_path / "store"


def _spawn(*args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The command line in a new process, from an operator's environment (not readied for
    SGLang), and the sglang, torch and sgl_kernel modules it had imported at its exit."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_USE_CPU_ENGINE")}
    done = subprocess.run(
        [sys.executable, "-c", AUDIT, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    imported = [line for line in done.stderr.splitlines() if line.startswith("IMPORTED ")]
    assert imported, done.stderr[-3000:]
    return done, json.loads(imported[-1].removeprefix("IMPORTED "))


@pytest.fixture
def cpu_host() -> None:
    if importlib.util.find_spec("sglang") is None:
        missing("sglang", "SGLang is not installed")
    if _torch.gpu_build() is not None:
        pytest.skip("on a GPU build of torch the restore asks torch for the device")


def test_a_fresh_restore_imports_neither_sglang_nor_torch(tmp_path: Path, cpu_host: None) -> None:
    store = _capsule(tmp_path)
    done, imported = _spawn(
        "restore", "cap", "--store", str(store), "--workdir", str(tmp_path / "restore"), "--json"
    )
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    admitted = [e for e in events if e.get("step") == "admit" and e.get("status") == "done"]
    assert admitted, done.stdout[-3000:] + done.stderr[-3000:]
    assert [n for n in imported if n.split(".")[0] in HEAVY] == []
    assert [n for n in imported if n.startswith(LIGHT_ONLY)] == []


@pytest.mark.parametrize("command", [("ls", "--store"), ("status",), ("stop", "cap")])
def test_ls_status_and_stop_import_neither_sglang_nor_torch(
    tmp_path: Path, cpu_host: None, command: tuple[str, ...]
) -> None:
    store = _capsule(tmp_path)
    args = (*command, str(store)) if command == ("ls", "--store") else command
    _done, imported = _spawn(*args)
    assert [n for n in imported if n.split(".")[0] in HEAVY] == []
