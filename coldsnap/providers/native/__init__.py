"""The native weight provider: export a model's final storages as 4 KiB-aligned packs with an
index, and hydrate them back into the same storages in place, fast and verified."""

from ._export import ExportResult, export_pack
from ._hydrate import (
    PREVERIFIED_ENV,
    HydrateReport,
    Hydrator,
    hydrate_pack,
    verify_pack,
)
from ._index import Extent, PackFile, PackIndex
from ._source import PackDirectory, PackSource, StorePack, import_pack, pack_members

__all__ = [
    "PREVERIFIED_ENV",
    "ExportResult",
    "Extent",
    "HydrateReport",
    "Hydrator",
    "PackDirectory",
    "PackFile",
    "PackIndex",
    "PackSource",
    "StorePack",
    "export_pack",
    "hydrate_pack",
    "import_pack",
    "pack_members",
    "verify_pack",
]
