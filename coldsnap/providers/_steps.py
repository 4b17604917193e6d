"""The weight providers' machine-side steps: what the orchestrator does about the weights while
the engine (through the plugin, in its own processes) exports and refills them.

`NativeProvider` (capability `payload`) finds the pack the engine exported at release and, on
restore, verifies it before the engine hydrates from it. `RecoveryProvider` (capability
`checkpoint`) checks on restore that the model's checkpoint is the one the capsule is bound to,
for the engine to reload. Either one's `stage` makes `weight_source`, which the engine adapter
hands to the engine; neither branches on an engine or a driver.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from coldsnap.artifacts import checkpoint_digests
from coldsnap.machine import Registry, StepContext, WeightSource
from coldsnap.machine import steps as s

from ._errors import CheckpointError, PackDamaged, ProviderError
from .native import PackDirectory, verify_pack

PACK_INDEX = "index.json"


def _packs(root: Path) -> list[Path]:
    """Every pack directory under `root` (a pack is a directory holding an index)."""
    return sorted(p.parent for p in root.rglob(PACK_INDEX))


class NativeProvider:
    """Native packs: exported by the engine at release, verified (and so pulled into the page
    cache) before a restored engine hydrates its storages from them."""

    name = "native"
    capabilities = frozenset({"payload"})

    def launch_weights(self, ctx: StepContext) -> dict[str, Any]:
        """At capture the engine exports its final storages on release (it picks where)."""
        return {s.WEIGHT_SOURCE.name: WeightSource(source="payload").to_fact()}

    def export(self, ctx: StepContext) -> dict[str, Any]:
        """Finds the payload the engine exported at release: `<root>/tp<rank>/<role>/` packs
        under the export directory. An engine may put each release's export under a root of its
        own; the newest root is this capture's."""
        exported = Path(ctx.facts[s.EXPORT_DIR.name])
        packs = _packs(exported) if exported.is_dir() else []
        if not packs:
            raise ProviderError(f"the engine exported no pack under {exported}")
        roots = {pack.parent.parent for pack in packs}
        payload = max(roots, key=lambda root: root.stat().st_mtime)
        size = sum(f.stat().st_size for f in payload.rglob("*") if f.is_file())
        return {
            s.PAYLOAD_DIR.name: str(payload),
            s.PAYLOAD_BYTES.name: size,
            s.PACKS.name: len(_packs(payload)),
        }

    def discard_export(self, ctx: StepContext) -> None:
        """Deletes the payload export found. After a seal the store has moved its files away,
        so only the empty directories are left to delete."""
        payload = ctx.facts.get(s.PAYLOAD_DIR.name)
        if payload and Path(payload).exists():
            shutil.rmtree(payload)

    def stage(self, ctx: StepContext) -> dict[str, Any]:
        """Verifies every block checksum of every pack; the engine may then hydrate without
        checking again (`preverified`)."""
        payload = Path(ctx.facts[s.PAYLOAD_DIR.name])
        packs = _packs(payload) if payload.is_dir() else []
        if not packs:
            raise PackDamaged(f"payload {payload}", ["holds no pack (no index.json under it)"])
        seconds = 0.0
        for pack in packs:
            ctx.check()
            seconds += verify_pack(PackDirectory(pack))
        source = WeightSource(source="payload", payload_dir=str(payload), preverified=True)
        return {
            s.WEIGHT_SOURCE.name: source.to_fact(),
            s.VERIFY_SECONDS.name: round(seconds, 3),
        }


class RecoveryProvider:
    """A pinned checkpoint: the model's files must be those the capture was bound to; the
    engine reloads its weights from them."""

    name = "recovery"
    capabilities = frozenset({"checkpoint"})

    def launch_weights(self, ctx: StepContext) -> dict[str, Any]:
        """At capture the engine loads the model's checkpoint (and its draft's) as usual."""
        return {s.WEIGHT_SOURCE.name: _checkpoint_source(ctx.request).to_fact()}

    def stage(self, ctx: StepContext) -> dict[str, Any]:
        """Checks every pinned file of the checkpoint by its sha256, and of the speculative
        draft model's when the capsule binds one (from the request's `draft.path`: a draft
        recovers from its own pinned checkpoint, never the target's)."""
        path = ctx.request.model.path
        pinned: dict[str, str] = ctx.facts[s.CAPSULE_CHECKPOINT.name]
        if not pinned:
            raise CheckpointError(
                f"model.path {path}", ["the capsule pins no checkpoint file to check against"]
            )
        _check_pins("model.path", path, pinned)
        source = WeightSource(source="checkpoint", checkpoint=path)
        draft_pins: dict[str, str] = ctx.facts.get(s.CAPSULE_DRAFT_CHECKPOINT.name) or {}
        if draft_pins:
            draft = getattr(ctx.request, "draft", None)
            if draft is None:
                raise CheckpointError(
                    "draft", ["the capsule serves a speculative draft model: name its checkpoint"]
                )
            _check_pins("draft.path", draft.path, draft_pins)
            source = WeightSource(source="checkpoint", checkpoint=path, draft_checkpoint=draft.path)
        return {
            s.WEIGHT_SOURCE.name: source.to_fact(),
            s.CHECKPOINT_FILES.name: len(pinned) + len(draft_pins),
        }


def _checkpoint_source(request: Any) -> WeightSource:
    draft = getattr(request, "draft", None)
    return WeightSource(
        source="checkpoint",
        checkpoint=request.model.path,
        draft_checkpoint=draft.path if draft is not None else None,
    )


def _check_pins(field: str, path: str, pinned: dict[str, str]) -> None:
    """CheckpointError naming every pinned file under `path` that is missing or differs."""
    found = {f.name: f.sha256 for f in checkpoint_digests(path)}
    wrong = [
        f"{name}: {'missing' if name not in found else 'differs from its pinned digest'}"
        for name, digest in sorted(pinned.items())
        if found.get(name) != digest
    ]
    if wrong:
        raise CheckpointError(f"{field} {path}: not the pinned checkpoint", wrong)


def build_native(request: Any) -> NativeProvider:
    return NativeProvider()


def build_recovery(request: Any) -> RecoveryProvider:
    return RecoveryProvider()


def register(registry: Registry) -> None:
    """Entry point of `coldsnap.registrations`: providers `native` and `recovery`."""
    registry.register_provider(
        "native",
        build=build_native,
        capabilities=NativeProvider.capabilities,
        doc="the engine's own final storages, exported at release and hydrated in place",
    )
    registry.register_provider(
        "recovery",
        build=build_recovery,
        capabilities=RecoveryProvider.capabilities,
        doc="the pinned checkpoint, checked by digest and reloaded by the engine",
    )


__all__ = ["NativeProvider", "RecoveryProvider", "build_native", "build_recovery", "register"]
