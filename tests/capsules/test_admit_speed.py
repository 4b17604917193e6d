"""What keeps an admit cheap without weakening it: the engine's identity is taken again only
when a file it is read from may have changed (coldsnap.artifacts.SourceMemo, used by
installed_sglang), and a seal remembers the image objects it hashed, so the first restore does
not hash them again while their inodes are unchanged."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coldsnap.artifacts import IntegrityError, SourceMemo, Store
from coldsnap.capsules import StoreArtifacts
from coldsnap.capsules import _steps as capsule_steps
from coldsnap.capsules._verified import Seen, VerifiedObjects
from coldsnap.engines.sglang import _build as sglang_build
from coldsnap.machine import steps as s

OLD = time.time() - 3600  # written an hour ago: settled


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        return f"value {self.calls}"


def _settled(path: Path, data: str | None = None) -> Path:
    if data is not None:
        path.write_text(data)
    os.utime(path, (OLD, OLD))
    return path


@pytest.fixture
def sources(tmp_path: Path) -> list[str]:
    folder = tmp_path / "pkg"
    folder.mkdir()
    a = _settled(folder / "a.py", "x = 1\n")
    b = _settled(folder / "b.py", "y = 2\n")
    _settled(folder)
    return [str(a), str(b), str(folder)]


def test_the_value_is_kept_while_its_sources_are_unchanged(sources: list[str]) -> None:
    compute = Counting()
    memo = SourceMemo(compute, lambda: sources)
    assert [memo(), memo(), memo()] == ["value 1"] * 3
    assert compute.calls == 1


@pytest.mark.parametrize("change", ["rewrite", "touch", "add_module", "remove"])
def test_any_change_a_stat_can_see_computes_again(
    sources: list[str], tmp_path: Path, change: str
) -> None:
    compute = Counting()
    memo = SourceMemo(compute, lambda: sources)
    assert memo() == "value 1"
    a = Path(sources[0])
    if change == "rewrite":
        a.write_text("x = 10\n")
        os.utime(a, (OLD, OLD))  # even with its time put back: the size differs
    elif change == "touch":
        os.utime(a)
    elif change == "add_module":
        (tmp_path / "pkg" / "c.py").write_text("z = 3\n")  # the folder lists one more
    else:
        a.unlink()
    assert memo() == "value 2"
    assert compute.calls == 2


def test_bytecode_caches_and_dot_folders_beside_the_sources_are_no_change(
    sources: list[str], tmp_path: Path
) -> None:
    """The first import of a fresh install writes `__pycache__` into its package folders, and
    tools make dot-folders in a checkout on the import path: neither changes what is imported,
    so neither computes again (it made the first use of every fresh clone compute twice)."""
    compute = Counting()
    memo = SourceMemo(compute, lambda: sources)
    assert memo() == "value 1"
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "pkg" / ".pytest_cache").mkdir()
    assert [memo(), memo()] == ["value 1", "value 1"]
    assert compute.calls == 1


def test_sources_written_just_before_are_not_trusted(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.py"
    fresh.write_text("x = 1\n")  # a write in the same clock tick could leave mtime as is
    compute = Counting()
    memo = SourceMemo(compute, lambda: [str(fresh)])
    assert [memo(), memo()] == ["value 1", "value 2"]
    _settled(fresh)
    assert [memo(), memo()] == ["value 3", "value 3"]


def test_a_failed_computation_keeps_nothing(sources: list[str]) -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("contract check failed")
        return "ok"

    memo = SourceMemo(flaky, lambda: sources)
    with pytest.raises(RuntimeError, match="contract check failed"):
        memo()
    assert [memo(), memo()] == ["ok", "ok"]
    assert len(calls) == 2


def test_installed_sglang_checks_the_contracts_once_per_unchanged_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import coldsnap.plugin
    from coldsnap.artifacts import _sources

    # The patched digest must reach neither the node's identity record nor from it.
    monkeypatch.setattr(_sources, "SOURCES_ROOT", tmp_path / "sources")
    digests: list[int] = []

    def digest() -> str:
        digests.append(1)
        return "sha256:contracts"

    monkeypatch.setattr(coldsnap.plugin, "digest", digest)
    sglang_build._INSTALLED.forget()
    try:
        first = sglang_build.installed_sglang()
        assert sglang_build.installed_sglang() == first
        assert (first.engine, first.contract) == ("sglang", "sha256:contracts")
        assert len(digests) == 1
    finally:
        sglang_build._INSTALLED.forget()  # the patched digest must not outlive this test


def test_installed_sglang_names_the_plugin_sources_and_the_distributions() -> None:
    """The plugin's files (its contract table), their folder, and the folder SGLang's
    distribution metadata lies in (an upgrade renames its .dist-info there)."""
    import importlib.metadata

    import coldsnap.plugin._contracts as contracts

    named = sglang_build._sglang_sources()
    site = str(importlib.metadata.distribution("sglang").locate_file(""))
    assert contracts.__file__ in named
    assert os.path.dirname(contracts.__file__) in named
    assert os.path.normpath(site) in {os.path.normpath(p) for p in named}


# -- the seal remembers what it hashed ------------------------------------------------------


def _seal_and_admit(
    tmp_path: Path, verified: VerifiedObjects, damage: Callable[[Path], None] | None = None
) -> tuple[int, dict[str, Any]]:
    """Seals a two-file image dumped an hour ago, optionally damages an object, then admits
    it; returns how many blocks the admit hashed, and its facts."""
    from tests.capsules.test_store_steps import Ctx, Engine, _capture_request, _restore_request

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    image = tmp_path / "op" / "image"
    image.mkdir(parents=True)
    for name, data in {"core-1.img": b"core" * 100, "pages-1.img": b"p" * 5000}.items():
        (image / name).write_bytes(data)
        os.utime(image / name, (OLD, OLD))
    facts: dict[str, Any] = {s.IMAGE_DIR.name: str(image), s.IMAGE_BYTES.name: 5400}
    seal = Ctx(_capture_request(tmp_path, model), tmp_path / "op", facts, s.SEAL)
    StoreArtifacts(Engine(), verified).seal(seal)
    store = Store(tmp_path / "store")
    (core,) = [m for m in store.capsule("cap").members if m.name == "image/core-1.img"]
    if damage is not None:
        damage(store.path(core.digest))
    hashed: list[int] = []
    real = capsule_steps._hash_block

    def counting(path: Path, block: int) -> str:
        hashed.append(block)
        return real(path, block)

    admit = Ctx(_restore_request(tmp_path), tmp_path / "res", {}, s.ADMIT)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capsule_steps, "_hash_block", counting)
        made = StoreArtifacts(Engine(), verified).admit(admit)
    return len(hashed), made


class _Forgetful(VerifiedObjects):
    """A node record that keeps nothing (another node's seal, or /run not writable)."""

    def remember(self, digest: str, path: Path, before: Seen) -> None:
        return None


def test_the_first_admit_does_not_hash_what_the_seal_hashed(tmp_path: Path) -> None:
    hashed, made = _seal_and_admit(tmp_path, VerifiedObjects(tmp_path / "verified"))
    assert hashed == 0
    assert Path(made[s.IMAGE_DIR.name], "core-1.img").read_bytes() == b"core" * 100


def test_without_the_seal_s_record_the_admit_hashes_every_block(tmp_path: Path) -> None:
    hashed, _ = _seal_and_admit(tmp_path, _Forgetful(tmp_path / "verified"))
    assert hashed == 2  # one block per member


def test_an_object_written_after_the_seal_is_hashed_and_refused(tmp_path: Path) -> None:
    def flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[0] ^= 1
        path.write_bytes(bytes(data))

    with pytest.raises(IntegrityError, match=r"image/core-1\.img"):
        _seal_and_admit(tmp_path, VerifiedObjects(tmp_path / "verified"), damage=flip)
