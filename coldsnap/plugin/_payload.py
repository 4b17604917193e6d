"""Native payload export and hydration, through coldsnap's native weight provider.

The provider owns the pack format and decides which tensors make up a model's final state
(parameters and persistent buffers, every alias named); the plugin hands it the registered
module and a directory. A payload root holds one pack per rank and role:
`<root>/tp<rank>/<role>/` (index.json and the pack files).

Hydration is split so that everything that can refuse does so before the engine's memory is
touched: `prepare` reads the index, compares layouts and (unless preverified) checks every
block checksum; only then is the weights region resumed and `hydrate` copies, unverified.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coldsnap._errors import PluginError


class PayloadRefused(PluginError, RuntimeError):
    """The payload cannot fill this model (missing, damaged, other layout); nothing changed."""


def pack_dir(root: Path | str, tp_rank: int, role: str) -> Path:
    return Path(root) / f"tp{tp_rank}" / role


def export(model: Any, dest: Path) -> dict[str, Any]:
    from coldsnap.providers.native import export_pack

    result = export_pack(model, dest)
    return {"path": str(dest), "nbytes": int(result.nbytes), "seconds": float(result.seconds)}


def prepare(model: Any, src: Path, *, verify: bool) -> tuple[Any, float]:
    """Opens and checks a pack for `model`; returns (source, verify seconds)."""
    from coldsnap.providers import ProviderError, layout_digest
    from coldsnap.providers.native import PackDirectory, verify_pack

    try:
        source = PackDirectory(src)
        want, have = source.index.layout_digest, layout_digest(model)
        if want != have:
            raise PayloadRefused(
                f"pack {src} was exported from another tensor layout ({want}; this model: {have})"
            )
        seconds = verify_pack(source) if verify else 0.0
    except ProviderError as exc:
        raise PayloadRefused(f"pack {src}: {exc}") from exc
    return source, seconds


def hydrate(model: Any, source: Any) -> dict[str, Any]:
    """Copies a prepared pack into the model's storages in place (already verified)."""
    from coldsnap.providers.native import hydrate_pack

    report = hydrate_pack(model, source, verify=False)
    return {
        "path": str(getattr(source, "path", "")),
        "nbytes": int(report.nbytes),
        "extents": int(report.extents),
        "copy_seconds": float(report.copy_seconds),
    }
