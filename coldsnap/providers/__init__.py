"""Weight providers: where a restored process gets its weights. `native` refills the exported
final storages in place; `recovery` reloads a pinned checkpoint plus the captured residual
state. Uses coldsnap.artifacts, and the leaves coldsnap._errors and coldsnap._atomic."""

from typing import TYPE_CHECKING, Any

from ._errors import CheckpointError, HydrationFailed, LayoutMismatch, PackDamaged, ProviderError
from ._layout import TensorView, final_tensors, layout_digest
from .native import (
    PREVERIFIED_ENV,
    ExportResult,
    Extent,
    HydrateReport,
    Hydrator,
    PackDirectory,
    PackFile,
    PackIndex,
    PackSource,
    StorePack,
    export_pack,
    hydrate_pack,
    import_pack,
    pack_members,
    verify_pack,
)

if TYPE_CHECKING:
    from .recovery import PinnedCheckpoint, RecoveryReport, capture_residual, load_recovery

_RECOVERY = ("PinnedCheckpoint", "RecoveryReport", "capture_residual", "load_recovery")
"""Loaded on first use: the recovery provider imports torch, which the orchestrator's steps
(the providers' registration, a restore's stage) do without."""


def __getattr__(name: str) -> Any:
    if name in _RECOVERY:
        from . import recovery

        return getattr(recovery, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PREVERIFIED_ENV",
    "CheckpointError",
    "ExportResult",
    "Extent",
    "HydrateReport",
    "HydrationFailed",
    "Hydrator",
    "LayoutMismatch",
    "PackDamaged",
    "PackDirectory",
    "PackFile",
    "PackIndex",
    "PackSource",
    "PinnedCheckpoint",
    "ProviderError",
    "RecoveryReport",
    "StorePack",
    "TensorView",
    "capture_residual",
    "export_pack",
    "final_tensors",
    "hydrate_pack",
    "import_pack",
    "layout_digest",
    "load_recovery",
    "pack_members",
    "verify_pack",
]
