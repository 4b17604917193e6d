"""Damaged packs and indexes, and destinations that do not match, are refused with a clear
error before any destination byte changes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coldsnap.artifacts import RecordError, Store
from coldsnap.providers import (
    LayoutMismatch,
    PackDamaged,
    PackDirectory,
    StorePack,
    export_pack,
    hydrate_pack,
)
from coldsnap.providers.native._index import compute_layout_digest
from coldsnap.providers.native._source import pack_file_name

from .provider_helpers import block_tensors, old_block_tensors, storage_bytes

BLOCK = 8192
REFUSED = (RecordError, PackDamaged, LayoutMismatch)


def source_tensors() -> dict[str, torch.Tensor]:
    return block_tensors(7)


def old_destination() -> dict[str, torch.Tensor]:
    return old_block_tensors()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("exported") / "pack"
    export_pack(source_tensors(), root, block_bytes=BLOCK)
    return root


def pack_path(directory: Path) -> Path:
    index = json.loads((directory / "index.json").read_text())
    return directory / pack_file_name(index["packs"][0]["digest"])


def attempt(directory: Path) -> tuple[BaseException | None, dict[str, torch.Tensor]]:
    dest = old_destination()
    before = storage_bytes(dest)
    error = None
    try:
        hydrate_pack(dest, PackDirectory(directory), verify=True)
    except REFUSED as exc:
        error = exc
    if error is not None:
        assert storage_bytes(dest) == before, "a refused hydration changed destination bytes"
    return error, dest


def test_the_undamaged_pack_hydrates(exported):
    error, dest = attempt(exported)
    assert error is None
    assert storage_bytes(dest) == storage_bytes(source_tensors())


def _covered_ranges(directory: Path) -> list[tuple[int, int]]:
    index = json.loads((directory / "index.json").read_text())
    return [(e["offset"], e["offset"] + e["nbytes"]) for e in index["extents"]]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_damaged_pack_files_are_refused(exported, tmp_path, data):
    work = Path(tempfile.mkdtemp(dir=tmp_path)) / "pack"
    shutil.copytree(exported, work)
    pack = pack_path(work)
    size = pack.stat().st_size
    damage = data.draw(st.sampled_from(["truncate", "flip", "append", "missing", "symlink"]))
    if damage == "truncate":
        os.truncate(pack, data.draw(st.integers(0, size - 1)))
    elif damage == "append":
        with open(pack, "ab") as handle:
            handle.write(b"\0" * data.draw(st.integers(1, 5000)))
    elif damage == "missing":
        pack.unlink()
    elif damage == "symlink":
        moved = work.parent / "elsewhere.pack"
        pack.rename(moved)
        pack.symlink_to(moved)
    else:
        offset = data.draw(st.integers(0, size - 1))
        with open(pack, "r+b") as handle:
            handle.seek(offset)
            byte = handle.read(1)[0]
            handle.seek(offset)
            handle.write(bytes([byte ^ data.draw(st.integers(1, 255))]))
        if not any(lo <= offset < hi for lo, hi in _covered_ranges(work)):
            error, dest = attempt(work)  # padding is not payload: the sha256 (store) covers it
            assert error is None and storage_bytes(dest) == storage_bytes(source_tensors())
            return
    error, _ = attempt(work)
    assert isinstance(error, PackDamaged), damage
    assert "nothing was written" in str(error)


def _mutations() -> st.SearchStrategy:
    bad_names = st.sampled_from(["..", "../etc/passwd", "/abs", "a/b", "a..b", "", ".x", "x."])
    return st.one_of(
        st.tuples(st.just("name"), bad_names),
        st.tuples(st.just("duplicate-name"), st.none()),
        st.tuples(st.just("pack-digest"), st.sampled_from(["sha256:" + "0" * 64, "sha256:zz", ""])),
        st.tuples(st.just("extent-pack"), st.just("sha256:" + "1" * 64)),
        st.tuples(st.just("nbytes"), st.integers(1, 1 << 40)),
        st.tuples(st.just("offset"), st.integers(1, 1 << 40)),
        st.tuples(st.just("pack-size"), st.integers(0, 1 << 20)),
        st.tuples(st.just("shape"), st.lists(st.integers(0, 100), min_size=1, max_size=3)),
        st.tuples(st.just("dtype"), st.sampled_from(["float16", "int8", "float64", "nonsense"])),
        st.tuples(st.just("stride"), st.lists(st.integers(0, 100), min_size=1, max_size=2)),
        st.tuples(st.just("checksum"), st.sampled_from(["0" * 16, "xyz", ""])),
        st.tuples(st.just("checksum-count"), st.none()),
        st.tuples(st.just("drop-extent"), st.none()),
        st.tuples(st.just("alias"), st.none()),
        st.tuples(st.just("extra-key"), st.text(min_size=1, max_size=4)),
        st.tuples(st.just("kind"), st.sampled_from(["coldsnap.capsule", "", "x"])),
        st.tuples(st.just("format"), st.sampled_from([0, 2, "1"])),
        st.tuples(st.just("not-json"), st.none()),
    )


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mutation=_mutations(), which=st.integers(0, 3), relayout=st.booleans())
def test_damaged_indexes_are_refused(exported, tmp_path, mutation, which, relayout):
    """Each mutation is applied as-is, or with the layout digest recomputed (a consistent but
    wrong index): either way the hydration is refused and nothing is written."""
    work = Path(tempfile.mkdtemp(dir=tmp_path)) / "pack"
    shutil.copytree(exported, work)
    index_file = work / "index.json"
    index = json.loads(index_file.read_text())
    what, value = mutation
    extents = index["extents"]
    extent = extents[which % len(extents)]
    view = extent["views"][0]
    if what == "name":
        view["name"] = value
    elif what == "duplicate-name":
        extents[(which + 1) % len(extents)]["views"][0]["name"] = view["name"]
    elif what == "pack-digest":
        index["packs"][0]["digest"] = value
    elif what == "extent-pack":
        extent["pack"] = value
    elif what == "nbytes":
        extent["nbytes"] += value
    elif what == "offset":
        extent["offset"] += value
    elif what == "pack-size":
        index["packs"][0]["size"] = value
    elif what == "shape":
        if value == view["shape"]:
            value = [*value, 1]
        view["shape"] = value
        view["stride"] = [1] * len(value)
    elif what == "dtype":
        if value == view["dtype"]:
            value = "nonsense"
        view["dtype"] = value
    elif what == "stride":
        view["stride"] = value if len(value) != len(view["shape"]) else [v + 7 for v in value]
    elif what == "checksum":
        extent["checksums"][0] = value if value != extent["checksums"][0] else "f" * 16
    elif what == "checksum-count":
        extent["checksums"].append("0" * 16)
    elif what == "drop-extent":
        extents.remove(extent)
    elif what == "alias":
        tied = next(e for e in extents if len(e["views"]) > 1)
        extras = tied["views"][1:]
        del tied["views"][1:]
        extents.append(dict(tied, views=extras))
    elif what == "extra-key":
        view[value if value not in view else value + "_x"] = 1
    elif what == "kind":
        index["kind"] = value
    elif what == "format":
        index["format"] = value
    if relayout:
        index["layout_digest"] = _relayout(index)
    text = "{not json" if what == "not-json" else json.dumps(index)
    index_file.write_text(text)
    error, _ = attempt(work)
    assert error is not None, mutation
    if isinstance(error, RecordError):  # the index itself is refused, naming where
        where = _NAMED.get(what, ("extents[", "layout_digest"))
        assert error.fields and all(f.startswith(where) for f in error.fields), (mutation, error)
    else:  # a well-formed index that does not fit the files or the destination
        assert "nothing was written" in str(error), (mutation, error)


# Where a RecordError must point for each mutation (default: an extent, or the layout digest).
_NAMED = {
    "kind": ("kind",),
    "format": ("format",),
    "not-json": ("$",),
    "pack-digest": ("packs[0]", "extents["),
}


def _relayout(index: dict) -> str:
    """The layout digest the (mutated) extents would have, where they can be parsed at all."""
    from coldsnap.providers._layout import TensorView
    from coldsnap.providers.native._index import Extent

    try:
        extents = tuple(
            Extent(
                views=tuple(TensorView(**v) for v in e["views"]),
                nbytes=e["nbytes"],
                pack=e["pack"],
                offset=e["offset"],
                sha256=e["sha256"],
                checksums=tuple(e["checksums"]),
            )
            for e in index["extents"]
        )
        return compute_layout_digest(extents)
    except (TypeError, ValueError, KeyError):
        return index["layout_digest"]


def test_layout_mismatches_name_each_problem_and_write_nothing(exported):
    cases = {
        "missing": lambda d: d.pop("norm.weight"),
        "extra": lambda d: d.__setitem__("new.weight", torch.zeros(3)),
        "shape": lambda d: d.__setitem__("norm.weight", torch.zeros(8, 8)),
        "dtype": lambda d: d.__setitem__("norm.weight", torch.zeros(64, dtype=torch.float64)),
        "nbytes": lambda d: d.__setitem__("mlp.w", torch.zeros(9001)[:9000]),
        "untied": lambda d: d.__setitem__("head.weight", d["head.weight"].clone()),
        "tied-more": lambda d: d.__setitem__("norm.weight", d["embed.weight"]),
    }
    expected = {
        "missing": "norm.weight: in the pack, missing from the destination",
        "extra": "new.weight: in the destination, not in the pack",
        "shape": "norm.weight: shape: expected (64,), found (8, 8)",
        "dtype": "norm.weight: dtype: expected float32, found float64",
        "nbytes": "mlp.w: storage nbytes: expected 36000, found 36004",
        "untied": "aliasing changed",
        "tied-more": "aliasing changed",
    }
    for case, change in cases.items():
        dest = old_destination()
        change(dest)
        before = storage_bytes(dest)
        with pytest.raises(LayoutMismatch) as info:
            hydrate_pack(dest, PackDirectory(exported))
        assert expected[case] in str(info.value), (case, str(info.value))
        assert "nothing was written" in str(info.value)
        assert storage_bytes(dest) == before, case


def test_damaged_store_objects_are_refused(tmp_path):
    store = Store(tmp_path / "store")
    result = export_pack(source_tensors(), store, block_bytes=BLOCK)
    digest = result.index.packs[0].digest
    path = store.path(digest)
    os.chmod(path, 0o600)
    with open(path, "r+b") as handle:
        handle.seek(100)
        handle.write(b"\xff\xfe")
    assert not store.verify().ok
    dest = old_destination()
    before = storage_bytes(dest)
    with pytest.raises(PackDamaged, match="checksum"):
        hydrate_pack(dest, StorePack(store, result.index_digest))
    assert storage_bytes(dest) == before
    os.truncate(path, 10)
    with pytest.raises(PackDamaged, match="truncated"):
        hydrate_pack(dest, StorePack(store, result.index_digest))
    path.unlink()
    with pytest.raises(PackDamaged, match="not in the store"):
        hydrate_pack(dest, StorePack(store, result.index_digest))
    assert storage_bytes(dest) == before


def test_strong_verification_checks_each_extent_sha256(exported, tmp_path):
    from coldsnap.providers import verify_pack

    work = tmp_path / "pack"
    shutil.copytree(exported, work)
    verify_pack(PackDirectory(work), strong=True)
    index = json.loads((work / "index.json").read_text())
    index["extents"][0]["sha256"] = "sha256:" + "0" * 64  # not part of the layout digest
    (work / "index.json").write_text(json.dumps(index))
    verify_pack(PackDirectory(work))  # the fast checksums still pass
    with pytest.raises(PackDamaged, match="sha256 expected"):
        verify_pack(PackDirectory(work), strong=True)


def test_provider_errors_are_operation_errors():
    from coldsnap._errors import OperationError
    from coldsnap.providers import CheckpointError, HydrationFailed, ProviderError
    from coldsnap.providers.native._cuda import RegistrationRefused

    assert issubclass(ProviderError, OperationError)
    for error in (LayoutMismatch, PackDamaged, CheckpointError, HydrationFailed):
        assert issubclass(error, ProviderError)
    assert issubclass(RegistrationRefused, ProviderError)


# -- a FIFO for a pack, a pack changed after verification ------------------------------------------


def _copy_of(exported: Path, tmp_path: Path) -> Path:
    target = tmp_path / "pack"
    shutil.copytree(exported, target)
    return target


def test_a_fifo_for_a_pack_is_refused_without_hanging(exported, tmp_path):
    import threading

    from coldsnap.providers.native import _hydrate

    directory = _copy_of(exported, tmp_path)
    path = pack_path(directory)
    path.unlink()
    os.mkfifo(path)
    box: dict = {}

    def run() -> None:
        try:
            hydrate_pack(old_destination(), PackDirectory(directory), verify=True)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # unblock the hung open so the test run can go on
        with open(path, "wb"):
            pass
        thread.join(10)
        pytest.fail("hydration hung on a FIFO")
    assert isinstance(box.get("error"), PackDamaged) and "not a regular file" in str(box["error"])
    assert _hydrate._shared()._busy.acquire(timeout=1), "the hydrator lock was left held"
    _hydrate._shared()._busy.release()


def test_a_pack_changed_after_verification_fails_the_hydration(exported, tmp_path, monkeypatch):
    from coldsnap.providers import HydrationFailed
    from coldsnap.providers.native import _hydrate

    directory = _copy_of(exported, tmp_path)
    path = pack_path(directory)
    real = _hydrate.Hydrator._copy

    def tamper_then_copy(self, jobs, files):
        data = bytearray(path.read_bytes())
        data[10] ^= 0xFF
        with open(path, "r+b") as handle:  # in place: the open descriptor sees the change
            handle.write(bytes(data))
        return real(self, jobs, files)

    monkeypatch.setattr(_hydrate.Hydrator, "_copy", tamper_then_copy)
    with pytest.raises(HydrationFailed, match="changed"):
        hydrate_pack(old_destination(), PackDirectory(directory), verify=True)


def test_the_native_provider_reads_no_preverified_variable(monkeypatch):
    """COLDSNAP_ARTIFACT_PREVERIFIED is read once, by the plugin's settings; hydration verifies
    unless its caller passes verify=False."""
    import inspect

    from coldsnap.providers.native import _hydrate

    monkeypatch.setenv("COLDSNAP_ARTIFACT_PREVERIFIED", "maybe")
    assert "os.environ" not in inspect.getsource(_hydrate)
    assert inspect.signature(_hydrate.hydrate_pack).parameters["verify"].default is True
