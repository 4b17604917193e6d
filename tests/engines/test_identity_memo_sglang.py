"""The engine build a restore checks, from a fresh process, without importing SGLang: the
first process imports it (contract check) and writes the node's record; the second, with
nothing changed, reads the record, never imports SGLang, and gets the same build, plugin digest
and contract variants included (the record holds them by value)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._support import missing

PROBE = """
import json, sys
from pathlib import Path
from coldsnap.artifacts import _sources
_sources.SOURCES_ROOT = Path(sys.argv[1])
import attrs
from coldsnap.engines.sglang import _build, cpu, installed_sglang
cpu.activate()  # what the adapter's build() does on a host without CUDA
build = installed_sglang()
print(json.dumps({"build": attrs.asdict(build), "last": _build._INSTALLED.last,
                  "sglang": "sglang" in sys.modules}))
"""


def _probe(root: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_a_second_fresh_process_takes_the_identity_without_importing_sglang(
    tmp_path: Path,
) -> None:
    if importlib.util.find_spec("sglang") is None:  # not imported here: the probes import it
        missing("sglang", "SGLang is not installed")
    first = _probe(tmp_path)
    assert (first["last"], first["sglang"]) == ("computed", True)
    assert len(list(tmp_path.glob("sglang-build-*.json"))) == 1
    second = _probe(tmp_path)
    assert (second["last"], second["sglang"]) == ("record", False)
    assert second["build"] == first["build"]
    assert first["build"]["plugin_digest"].startswith("sha256:") and first["build"]["variants"]


def test_a_recorded_build_carries_its_plugin_digest_and_variants_by_value(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Unit: the build a fresh process reads from the record is the one the check computed,
    plugin digest and variants included, with no check in that process (fake check; the
    record is written and read under tmp_path)."""
    import coldsnap.plugin
    from coldsnap.artifacts import _sources
    from coldsnap.engines.sglang import _build

    monkeypatch.setattr(_sources, "SOURCES_ROOT", tmp_path)
    monkeypatch.setattr(coldsnap.plugin, "digest", lambda: "sha256:contracts")
    monkeypatch.setattr(coldsnap.plugin, "plugin_digest", lambda: "sha256:plugin")
    monkeypatch.setattr(coldsnap.plugin, "variants_checked", lambda: {"k": "0.5.23:new"})
    monkeypatch.setattr(_build, "_sglang_sources", lambda: [])  # nothing that can change
    memo = _build.SourceMemo(
        _build._installed_sglang, lambda: _build._sglang_sources(), persist=_build._PERSISTED
    )
    monkeypatch.setattr(_build, "_INSTALLED", memo)
    computed = _build.installed_sglang()
    assert memo.last == "computed"
    assert (computed.plugin_digest, computed.variants) == ("sha256:plugin", {"k": "0.5.23:new"})
    monkeypatch.setattr(coldsnap.plugin, "digest", lambda: pytest.fail("checked again"))
    memo.forget()  # a fresh process: only the record
    assert _build.installed_sglang() == computed and memo.last == "record"
