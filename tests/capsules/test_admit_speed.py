"""What keeps an admit cheap without weakening it: a capsule's engine build that names its source
files is checked by hashing them where they are now (`Engine.build(recorded)`), never by taking
the engine's build again (which imports the engine), and a changed file is refused by name; a
seal remembers the image objects it hashed, so the first restore does not hash them again while
their inodes are unchanged."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from coldsnap.artifacts import IncompatibleArtifact, IntegrityError, Store, sha256_file
from coldsnap.capsules import StoreArtifacts
from coldsnap.capsules import _steps as capsule_steps
from coldsnap.capsules._verified import Seen, VerifiedObjects
from coldsnap.engines.sglang import _build as sglang_build
from coldsnap.machine import InstalledBuild
from coldsnap.machine import steps as s

OLD = time.time() - 3600  # written an hour ago: settled


class SourcesEngine:
    """The store's test engine, whose build names one source file of a package on the import
    path, and which checks a recorded build the SGLang adapter's way (`recorded_sglang`)."""

    def __init__(self, source: Path) -> None:
        from tests.capsules.test_store_steps import Engine

        self._base = Engine()
        self.name, self.capabilities = self._base.name, self._base.capabilities
        self.source = source
        self.taken = 0  # builds taken from the engine itself (what imports it)

    def build(self, recorded: InstalledBuild | None = None) -> InstalledBuild:
        if recorded is not None:
            return sglang_build.recorded_sglang(recorded)
        self.taken += 1
        base = self._base.build()
        return attrs.evolve(
            base,
            engine=sglang_build.ENGINE,
            version="1.0",
            sources={sglang_build.source_key(self.source): sha256_file(self.source)},
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A top-level package on the import path, never imported: its module's file."""
    root = tmp_path / "path"
    (root / "enginepkg").mkdir(parents=True)
    (root / "enginepkg" / "__init__.py").write_text("")
    module = root / "enginepkg" / "scheduler.py"
    module.write_text("def serve():\n    return 1\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(sglang_build, "_version", lambda: "1.0")  # its distribution's metadata
    return module


def _sealed(tmp_path: Path, engine: SourcesEngine) -> None:
    from tests.capsules.test_store_steps import Ctx, _capture_request

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    image = tmp_path / "op" / "image"
    image.mkdir(parents=True)
    (image / "core-1.img").write_bytes(b"core" * 100)
    facts: dict[str, Any] = {s.IMAGE_DIR.name: str(image), s.IMAGE_BYTES.name: 400}
    seal = Ctx(_capture_request(tmp_path, model), tmp_path / "op", facts, s.SEAL)
    StoreArtifacts(engine, VerifiedObjects(tmp_path / "verified")).seal(seal)  # type: ignore[arg-type]


def _admit(tmp_path: Path, engine: SourcesEngine) -> dict[str, Any]:
    from tests.capsules.test_store_steps import Ctx, _restore_request

    admit = Ctx(_restore_request(tmp_path), tmp_path / "res", {}, s.ADMIT)
    return StoreArtifacts(engine, VerifiedObjects(tmp_path / "verified")).admit(admit)  # type: ignore[arg-type]


def test_the_capsule_binds_the_source_files_of_the_engine_build(
    tmp_path: Path, package: Path
) -> None:
    engine = SourcesEngine(package)
    _sealed(tmp_path, engine)
    identity = Store(tmp_path / "store").capsule("cap").identity
    assert identity is not None and identity.format == 2
    assert identity.engine.sources == {"enginepkg/scheduler.py": sha256_file(package)}


def test_admit_checks_the_recorded_build_by_its_files_without_taking_it_again(
    tmp_path: Path, package: Path
) -> None:
    engine = SourcesEngine(package)
    _sealed(tmp_path, engine)
    made = _admit(tmp_path, engine)
    assert engine.taken == 1  # the seal's, never the admit's
    assert Path(made[s.IMAGE_DIR.name], "core-1.img").read_bytes() == b"core" * 100
    assert "enginepkg" not in __import__("sys").modules


@pytest.mark.parametrize("change", ["edit", "remove"])
def test_admit_refuses_a_changed_engine_file_by_name(
    tmp_path: Path, package: Path, change: str
) -> None:
    engine = SourcesEngine(package)
    _sealed(tmp_path, engine)
    recorded = sha256_file(package)
    if change == "edit":
        package.write_text("def serve():\n    return 2\n")
    else:
        package.unlink()
    with pytest.raises(IncompatibleArtifact) as info:
        _admit(tmp_path, engine)
    (difference,) = info.value.differences
    assert difference.field == "engine.sources[enginepkg/scheduler.py]"
    assert difference.expected == recorded
    assert difference.found == (sha256_file(package) if change == "edit" else "missing")
    assert "enginepkg/scheduler.py" in str(info.value)
    assert not (tmp_path / "res" / "image").exists()  # nothing laid out


def test_admit_refuses_another_engine_version(
    tmp_path: Path, package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = SourcesEngine(package)
    _sealed(tmp_path, engine)
    monkeypatch.setattr(sglang_build, "_version", lambda: "2.0")
    with pytest.raises(IncompatibleArtifact, match=r"engine\.version: expected 1\.0, found 2\.0"):
        _admit(tmp_path, engine)


def test_a_source_key_finds_its_file_again_through_the_import_path(package: Path) -> None:
    key = sglang_build.source_key(package)
    assert key == "enginepkg/scheduler.py"
    assert sglang_build._locate(key) == package.resolve()
    with pytest.raises(ValueError, match="no module of the import path"):
        sglang_build.source_key(package.parent.parent.parent / "elsewhere.py")


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
