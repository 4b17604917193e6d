"""One-pass verified hydration (`one_pass=True`): every block is checked as it lands in its CPU
storage, so any damaged byte the index covers fails the hydration, naming its block."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coldsnap.providers import (
    HydrationFailed,
    Hydrator,
    PackDamaged,
    PackDirectory,
    export_pack,
    hydrate_pack,
)
from coldsnap.providers.native import _hydrate
from coldsnap.providers.native._source import pack_file_name

from .provider_helpers import block_tensors, old_block_tensors, storage_bytes

BLOCK = 8192


def source_tensors() -> dict[str, torch.Tensor]:
    return block_tensors(11)


def destination() -> dict[str, torch.Tensor]:
    return old_block_tensors()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("one-pass") / "pack"
    export_pack(source_tensors(), root, block_bytes=BLOCK)
    return root


def _index(directory: Path) -> dict:
    return json.loads((directory / "index.json").read_text())


def _pack_path(directory: Path) -> Path:
    return directory / pack_file_name(_index(directory)["packs"][0]["digest"])


@pytest.mark.parametrize("piece", [4096, 1 << 20], ids=["several-pieces", "one-piece"])
def test_one_pass_is_bit_exact_in_place(exported, monkeypatch, piece):
    monkeypatch.setattr(_hydrate, "_CHECK_PIECE", piece)
    dest = destination()
    pointers = {name: t.data_ptr() for name, t in dest.items()}
    report = hydrate_pack(dest, PackDirectory(exported), one_pass=True)
    assert storage_bytes(dest) == storage_bytes(source_tensors())
    assert {name: t.data_ptr() for name, t in dest.items()} == pointers
    assert dest["embed.weight"].data_ptr() == dest["head.weight"].data_ptr()
    assert report.verified and report.checked_in_copy
    assert report.verify_seconds == 0.0  # CPU only: no separate pass


def test_one_pass_without_verification_is_the_plain_copy(exported):
    report = hydrate_pack(destination(), PackDirectory(exported), verify=False, one_pass=True)
    assert not report.verified and not report.checked_in_copy


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_damaged_covered_byte_fails_naming_its_block(exported, data):
    index = _index(exported)
    extent = data.draw(st.sampled_from(index["extents"]))
    at = data.draw(st.integers(0, extent["nbytes"] - 1))
    piece = data.draw(st.sampled_from([4096, 1 << 20]))
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch) / "pack"
        shutil.copytree(exported, work)
        path = _pack_path(work)
        raw = bytearray(path.read_bytes())
        raw[extent["offset"] + at] ^= 0x5A
        path.write_bytes(bytes(raw))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_hydrate, "_CHECK_PIECE", piece)
            with pytest.raises(HydrationFailed) as info:
                Hydrator(threads=2).hydrate(destination(), PackDirectory(work), one_pass=True)
    message = str(info.value)
    assert f"{extent['views'][0]['name']}: block {at // BLOCK} " in message
    assert "must not be served" in message


def test_a_truncated_pack_is_still_refused_before_any_write(exported, tmp_path):
    work = tmp_path / "pack"
    shutil.copytree(exported, work)
    path = _pack_path(work)
    path.write_bytes(path.read_bytes()[:-4096])
    dest = destination()
    before = storage_bytes(dest)
    with pytest.raises(PackDamaged, match="truncated"):
        hydrate_pack(dest, PackDirectory(work), one_pass=True)
    assert storage_bytes(dest) == before


def test_the_two_pass_default_still_writes_nothing_on_damage(exported, tmp_path):
    """one_pass is opt-in: without it a bad block is found before the first write."""
    work = tmp_path / "pack"
    shutil.copytree(exported, work)
    path = _pack_path(work)
    raw = bytearray(path.read_bytes())
    raw[_index(work)["extents"][-1]["offset"]] ^= 1
    path.write_bytes(bytes(raw))
    dest = destination()
    before = storage_bytes(dest)
    with pytest.raises(PackDamaged, match="nothing was written"):
        hydrate_pack(dest, PackDirectory(work))
    assert storage_bytes(dest) == before


def test_the_pack_is_mapped_only_during_the_hydration(exported, monkeypatch):
    """One pass reads the pack through a read-only mapping, unmapped when the call returns."""
    pack = str(_pack_path(exported))
    seen: list[str] = []
    real = _hydrate._copy_checked

    def spy(source: int, address: int, size: int) -> str:
        seen.append(Path("/proc/self/maps").read_text())
        return real(source, address, size)

    monkeypatch.setattr(_hydrate, "_copy_checked", spy)
    hydrate_pack(destination(), PackDirectory(exported), one_pass=True)
    assert seen and all(pack in maps for maps in seen)
    assert next(line for line in seen[0].splitlines() if pack in line).split()[1] == "r--s"
    assert pack not in Path("/proc/self/maps").read_text()
