"""The files an SGLang build is read from: the modules the plugin's contracts look their targets
up in and define them in (a re-export names both), the plugin's own files, and the CPU
stand-ins while they are in use, each named as the import path reaches it."""

from __future__ import annotations

import json
import json.decoder
import sys
from pathlib import Path

import pytest

import coldsnap.plugin
from coldsnap.artifacts import sha256_file
from coldsnap.engines.sglang import _build, cpu
from coldsnap.plugin import Contract, contract_files, plugin_files


def _contract(target: str, **kw: object) -> Contract:
    return Contract(group="test", target=target, **kw)  # type: ignore[arg-type]


def test_a_contract_names_the_module_it_is_looked_up_in_and_the_one_defining_it() -> None:
    found = contract_files([_contract("json.JSONDecoder.decode")])
    assert found == sorted({json.__file__, json.decoder.__file__})


def test_an_absent_variant_names_no_file() -> None:
    absent = _contract("json.no_such_thing", kind="absent")
    assert contract_files([absent]) == []


def test_the_plugin_files_are_those_its_digest_hashes() -> None:
    files = plugin_files()
    assert coldsnap.plugin._contracts.__file__ in files
    assert all(Path(f).parent == Path(coldsnap.plugin.__file__).parent for f in files)


def test_the_build_binds_every_file_it_is_read_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coldsnap.plugin, "digest", lambda: "sha256:" + "c0" * 32)
    monkeypatch.setattr(coldsnap.plugin, "plugin_digest", lambda: "sha256:" + "d0" * 32)
    monkeypatch.setattr(coldsnap.plugin, "variants_checked", lambda: {"k": "0.5.23:v"})
    monkeypatch.setattr(coldsnap.plugin, "contract_files", lambda: [json.decoder.__file__])
    monkeypatch.setattr(_build, "_version", lambda: "1.0")
    monkeypatch.setattr(_build.importlib.metadata, "version", lambda name: "1.0")
    monkeypatch.setattr(sys, "path", [str(cpu.PYTHONPATH_DIR), *sys.path])  # stand-ins in use
    build = _build.installed_sglang()
    assert build.sources["json/decoder.py"] == sha256_file(json.decoder.__file__)
    assert build.sources["coldsnap/plugin/_contracts.py"] == sha256_file(
        coldsnap.plugin._contracts.__file__
    )
    assert {"sgl_kernel/__init__.py", "_coldsnap_cpu_support.py"} <= set(build.sources)
    assert _build.recorded_sglang(build) == build  # and the install checks against it
