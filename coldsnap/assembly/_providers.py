"""The weight-provider steps of the machines. The engine exports and hydrates in its own
process (the plugin); these steps check the payload on the orchestrator's side and prepare it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from coldsnap.artifacts import checkpoint_digests
from coldsnap.machine import Skipped, StepContext
from coldsnap.providers import PackDirectory, verify_pack


def _packs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("index.json"))


class NativeProvider:
    """Native packs: exported by the engine at release, verified and warmed before restore."""

    name = "native"

    def export(self, ctx: StepContext) -> dict[str, Any]:
        """Finds the payload the engine exported at release: `<root>/tp<rank>/<role>/` packs
        (an engine may put each release's export under a root of its own: take the newest)."""
        exported = Path(ctx.facts["payload_dir"])
        packs = _packs(exported)
        if not packs:
            raise RuntimeError(f"the engine exported no pack under {exported}")
        roots = {p.parent.parent for p in packs}
        payload = max(roots, key=lambda r: r.stat().st_mtime)
        nbytes = sum(f.stat().st_size for f in payload.rglob("*") if f.is_file())
        return {"payload_dir": str(payload), "payload_bytes": nbytes,
                "packs": len(_packs(payload))}

    def discard_export(self, ctx: StepContext) -> None:
        payload = ctx.facts.get("payload_dir")
        if payload:
            shutil.rmtree(payload, ignore_errors=True)

    def stage(self, ctx: StepContext) -> dict[str, Any]:
        """Verifies every block checksum (which also pulls the packs into the page cache)."""
        seconds = 0.0
        for pack in _packs(Path(ctx.facts["payload_dir"])):
            ctx.check()
            seconds += verify_pack(PackDirectory(pack))
        return {"payload_verified": True, "verify_seconds": round(seconds, 3)}

    def unstage(self, ctx: StepContext) -> None:
        return None  # staging holds nothing but the page cache

    def hydrate(self, ctx: StepContext) -> Skipped:
        return Skipped("the engine hydrated its storages in place when the weights resumed")


class RecoveryProvider:
    """A pinned checkpoint: its files must be the ones the capture was bound to."""

    name = "recovery"

    def stage(self, ctx: StepContext) -> dict[str, Any]:
        model = ctx.request.model
        found = {f.name: f.sha256 for f in checkpoint_digests(model.path)}
        pinned = ctx.facts.get("capsule_checkpoint") or {}
        wrong = sorted(n for n, d in pinned.items() if found.get(n) != d)
        if wrong:
            raise ValueError(
                f"model.path {model.path}: files differ from the pinned checkpoint: "
                + ", ".join(wrong)
            )
        return {"checkpoint_files": len(found)}

    def unstage(self, ctx: StepContext) -> None:
        return None
