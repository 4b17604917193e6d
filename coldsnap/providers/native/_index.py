"""The pack index: which extent of which pack holds which storage, and how to check its bytes.

An extent is one storage, written once, 4 KiB-aligned in its pack; `views` lists every name
that aliases it. `checksums` are xxh3_64 digests of consecutive `block_bytes` blocks of the
extent (the last one shorter): fast enough to check at hydration, and per block so several
threads can check one large extent. `sha256` is the extent's strong digest; the pack file's
own sha256 is its content address in the store.
"""

from __future__ import annotations

import itertools
import re
from typing import ClassVar

from attrs import field, frozen

from coldsnap.artifacts import RecordError, validate

from .._layout import TensorView, digest_of_rows, layout_of

INDEX_FORMAT = 1
ALIGNMENT = 4096
CHECKSUM = "xxh3_64"
_XXH3_64 = re.compile(r"[0-9a-f]{16}")


@frozen
class PackFile:
    digest: str = field(validator=validate.digest)
    size: int = field(validator=validate.count)


@frozen
class Extent:
    views: tuple[TensorView, ...] = field(converter=tuple)
    nbytes: int = field(validator=validate.count)
    pack: str = field(validator=validate.digest)
    offset: int = field(validator=validate.count)
    sha256: str = field(validator=validate.digest)
    checksums: tuple[str, ...] = field(converter=tuple)

    @property
    def name(self) -> str:
        return self.views[0].name if self.views else "?"


def blocks(nbytes: int, block_bytes: int) -> int:
    return -(-nbytes // block_bytes)


@frozen
class PackIndex:
    """The index of one export. Constructing one (or reading one) checks it whole: a damaged
    or hand-edited index is refused before anything is read or written."""

    KIND: ClassVar[str] = "coldsnap.native.index"

    packs: tuple[PackFile, ...] = field(converter=tuple)
    extents: tuple[Extent, ...] = field(converter=tuple)
    layout_digest: str
    block_bytes: int = field(validator=validate.count)
    alignment: int = field(default=ALIGNMENT, validator=validate.exactly(ALIGNMENT))
    checksum: str = field(default=CHECKSUM, validator=validate.exactly(CHECKSUM))
    format: int = field(default=INDEX_FORMAT, validator=validate.exactly(INDEX_FORMAT))
    kind: str = field(default=KIND, validator=validate.exactly(KIND))

    def __attrs_post_init__(self) -> None:
        problems = index_problems(self)
        if problems:
            raise RecordError(self.KIND, problems)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.extents)

    def names(self) -> list[str]:
        return [v.name for e in self.extents for v in e.views]

    def pack(self, digest: str) -> PackFile:
        for pack in self.packs:
            if pack.digest == digest:
                return pack
        raise KeyError(digest)


def compute_layout_digest(extents: tuple[Extent, ...]) -> str:
    return digest_of_rows(layout_of((e.views, e.nbytes) for e in extents))


def index_problems(index: PackIndex) -> list[tuple[str, str]]:
    """Every cross-field problem of an index: unknown or duplicate packs, misaligned or
    overlapping extents, lengths past the end of their pack, duplicate names, views outside
    their storage, checksum counts, and a layout digest that does not match."""
    problems: list[tuple[str, str]] = []
    if index.block_bytes <= 0 or index.block_bytes % ALIGNMENT:
        problems.append(("block_bytes", f"{index.block_bytes} is not a positive multiple of 4096"))
        return problems
    sizes: dict[str, int] = {}
    for i, pack in enumerate(index.packs):
        if pack.digest in sizes:
            problems.append((f"packs[{i}]", f"duplicate pack {pack.digest}"))
        sizes[pack.digest] = pack.size
    seen: dict[str, str] = {}
    spans: dict[str, list[tuple[int, int, int]]] = {}
    for i, extent in enumerate(index.extents):
        where = f"extents[{i}]"
        if not extent.views:
            problems.append((where, "an extent needs at least one view"))
        for view in extent.views:
            if view.name in seen:
                problems.append((f"{where}.views", f"duplicate name {view.name!r}"))
            seen[view.name] = where
            if view.end_byte > extent.nbytes:
                problems.append(
                    (
                        f"{where}.views",
                        f"{view.name!r} reaches byte {view.end_byte}, past the storage's "
                        f"{extent.nbytes} bytes",
                    )
                )
        if extent.pack not in sizes:
            problems.append((f"{where}.pack", f"{extent.pack} is not one of the index's packs"))
        else:
            if extent.offset % ALIGNMENT:
                problems.append((f"{where}.offset", f"{extent.offset} is not 4096-aligned"))
            if extent.offset + extent.nbytes > sizes[extent.pack]:
                problems.append(
                    (
                        f"{where}.nbytes",
                        f"bytes {extent.offset}..{extent.offset + extent.nbytes} run past the end "
                        f"of the pack ({sizes[extent.pack]} bytes)",
                    )
                )
            spans.setdefault(extent.pack, []).append((extent.offset, extent.nbytes, i))
        want = blocks(extent.nbytes, index.block_bytes)
        if len(extent.checksums) != want:
            problems.append(
                (f"{where}.checksums", f"{len(extent.checksums)} checksums for {want} blocks")
            )
        bad = [c for c in extent.checksums if not (isinstance(c, str) and _XXH3_64.fullmatch(c))]
        if bad:
            problems.append((f"{where}.checksums", f"not xxh3_64 hex digests: {bad[:3]!r}"))
    for pack_spans in spans.values():
        pack_spans.sort()
        for (a_off, a_len, a), (b_off, _, b) in itertools.pairwise(pack_spans):
            if b_off < a_off + a_len:
                problems.append((f"extents[{b}].offset", f"overlaps extents[{a}]"))
    if not problems and compute_layout_digest(index.extents) != index.layout_digest:
        problems.append(("layout_digest", "does not match the extents (a damaged index?)"))
    return problems
