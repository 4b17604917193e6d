"""The engine identity a restore checks, from a fresh process, without importing SGLang: the
first process imports it (contract check) and writes the node's record; the second, with
nothing changed, reads the record, never imports SGLang, and gets the same engine identity and
the same plugin digest (whose contract variants come from the record too)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PROBE = """
import json, sys
from pathlib import Path
from coldsnap.artifacts import _sources
_sources.SOURCES_ROOT = Path(sys.argv[1])
from coldsnap.engines.sglang import _steps, cpu, installed_sglang
from coldsnap.plugin import plugin_digest
cpu.activate()  # what the adapter's build() does on a host without CUDA
identity = installed_sglang()
print(json.dumps({"identity": identity, "plugin": plugin_digest(),
                  "last": _steps._INSTALLED.last, "sglang": "sglang" in sys.modules}))
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
        pytest.skip("SGLang is not installed")
    first = _probe(tmp_path)
    assert (first["last"], first["sglang"]) == ("computed", True)
    assert len(list(tmp_path.glob("sglang-build-*.json"))) == 1
    second = _probe(tmp_path)
    assert (second["last"], second["sglang"]) == ("record", False)
    assert second["identity"] == first["identity"]
    assert second["plugin"] == first["plugin"]


def test_a_recorded_identity_lends_its_variants_to_the_plugin_digest(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Unit: the variants the record holds are what plugin_digest() binds when no check ran in
    this process (fake check; the record is written and read under tmp_path)."""
    import coldsnap.plugin
    from coldsnap.artifacts import _sources
    from coldsnap.engines.sglang import _steps
    from coldsnap.plugin import _contracts

    monkeypatch.setattr(_sources, "SOURCES_ROOT", tmp_path)
    monkeypatch.setattr(coldsnap.plugin, "digest", lambda: "sha256:contracts")
    monkeypatch.setattr(coldsnap.plugin, "variants_checked", lambda: {"k": "0.5.23:new"})
    monkeypatch.setattr(_steps, "_sglang_sources", lambda: [])  # nothing that can change
    monkeypatch.setattr(_contracts, "_CHECKED", None)
    monkeypatch.setattr(_contracts, "_RECALLED", None)
    memo = _steps.SourceMemo(
        _steps._installed_sglang, lambda: _steps._sglang_sources(), persist=_steps._PERSISTED
    )
    monkeypatch.setattr(_steps, "_INSTALLED", memo)
    computed = _steps.installed_sglang()
    assert memo.last == "computed" and _contracts._RECALLED is None  # the check's own

    files_only = _contracts.plugin_digest()
    memo.forget()  # a fresh process: only the record
    assert _steps.installed_sglang() == computed and memo.last == "record"
    assert _contracts.variants_checked() == {"k": "0.5.23:new"}
    assert _contracts.plugin_digest() != files_only
