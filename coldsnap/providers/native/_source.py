"""Where a pack's bytes are: an export directory, or objects of a store. Both give the index and
the path of each pack file; a pack is always named by its digest, never by a path from a record."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, runtime_checkable

from coldsnap.artifacts import DIGEST_PREFIX, Member, Store, StoreError

from .._convert import dumps, loads
from .._errors import PackDamaged
from ._index import PackIndex

INDEX_NAME = "index.json"


@runtime_checkable
class PackSource(Protocol):
    """An index and the files of its packs."""

    @property
    def index(self) -> PackIndex: ...

    def pack_path(self, digest: str) -> Path: ...


def pack_file_name(digest: str) -> str:
    return digest.removeprefix(DIGEST_PREFIX) + ".pack"


class PackDirectory:
    """An export directory: `index.json` and one `<sha256 hex>.pack` per pack."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            data = (self.path / INDEX_NAME).read_bytes()
        except OSError as exc:
            raise PackDamaged(f"no pack index in {self.path}:", [str(exc)]) from None
        self._index = loads(data, PackIndex)

    @property
    def index(self) -> PackIndex:
        return self._index

    def pack_path(self, digest: str) -> Path:
        self._index.pack(digest)  # only digests the (validated) index names
        return self.path / pack_file_name(digest)


class StorePack:
    """A pack whose index and pack files are objects of a store."""

    def __init__(self, store: Store, index_digest: str) -> None:
        self.store = store
        self.index_digest = index_digest
        self._index = loads(store.read_bytes(index_digest), PackIndex)

    @property
    def index(self) -> PackIndex:
        return self._index

    def pack_path(self, digest: str) -> Path:
        self._index.pack(digest)
        try:
            return self.store.path(digest)
        except StoreError as exc:
            raise PackDamaged(
                "a pack is not in the store:", [f"pack {digest}: not in the store ({exc})"]
            ) from None


def import_pack(store: Store, directory: str | os.PathLike[str], *, adopt: bool = True) -> str:
    """Moves (adopt=True, same filesystem, no copy) or copies an export directory's packs into
    `store`, then adds its index; returns the index's digest. Each pack is rehashed on the way
    in and must match the digest the index names."""
    source = PackDirectory(directory)
    for pack in source.index.packs:
        path = source.pack_path(pack.digest)
        digest = store.adopt(path) if adopt else store.put_file(path)
        if digest != pack.digest:
            raise PackDamaged(
                f"pack {path.name} does not match its index:",
                [f"expected {pack.digest}, found {digest}"],
            )
    return store.put_bytes(dumps(source.index))


def pack_members(store: Store, index_digest: str, *, prefix: str = "weights") -> tuple[Member, ...]:
    """Capsule members for a pack in `store`: its index (role `pack-index`) and every pack file
    (role `pack`), named under `prefix`."""
    index = StorePack(store, index_digest).index
    members = [
        Member("pack-index", f"{prefix}/{INDEX_NAME}", index_digest, store.size(index_digest))
    ]
    members += [
        Member("pack", f"{prefix}/{pack_file_name(p.digest)}", p.digest, p.size)
        for p in index.packs
    ]
    return tuple(members)
