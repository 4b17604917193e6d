"""The weight providers' machine-side steps: what the orchestrator does about the weights while
the engine (through the plugin, in its own processes) exports and refills them.

`NativeProvider` (capability `payload`) finds the pack the engine exported at release and, on
restore, verifies it before the engine hydrates from it. `RecoveryProvider` (capability
`checkpoint`) checks on restore that the model's checkpoint is the one the capsule is bound to,
for the engine to reload. Either one's `stage` makes `weight_source`, which the engine adapter
hands to the engine; neither branches on an engine or a driver.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from coldsnap.artifacts import checkpoint_digests
from coldsnap.machine import ComponentError, Registry, StepContext
from coldsnap.machine import steps as s

from ._errors import CheckpointError, PackDamaged, ProviderError
from .native import PackDirectory, _prefill, verify_pack

PREFILL_TIMEOUT_S = 300.0  # the longest a helper waits for the engine to take its memory

PACK_INDEX = "index.json"


def _packs(root: Path) -> list[Path]:
    """Every pack directory under `root` (a pack is a directory holding an index)."""
    return sorted(p.parent for p in root.rglob(PACK_INDEX))


class NativeProvider:
    """Native packs: exported by the engine at release, verified (and so pulled into the page
    cache) before a restored engine hydrates its storages from them."""

    name = "native"
    capabilities = frozenset({"payload"})

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
        return {
            s.WEIGHT_SOURCE.name: {
                "provider": self.name,
                "payload_dir": str(payload),
                "preverified": True,
            },
            s.VERIFY_SECONDS.name: round(seconds, 3),
        }

    # -- prefill (restores of CUDA engines; coldsnap.providers.native._prefill) ----------------

    def prefill(self, ctx: StepContext) -> dict[str, Any]:
        """Starts one helper per rank that copies the verified payload into device memory of its
        own, for the restored engine to copy device to device (rank r on GPU r: SGLang's
        default placement). Returns at once: the helpers work while the process is restored."""
        payload = Path(ctx.facts[s.WEIGHT_SOURCE.name]["payload_dir"])
        ranks = _prefill.rank_roles(payload)
        if not ranks:
            raise PackDamaged(f"payload {payload}", ["holds no tp<rank>/<role> pack to prefill"])
        root = ctx.workdir / "prefill"
        shutil.rmtree(root, ignore_errors=True)  # a retried step starts over
        root.mkdir(parents=True)
        procs: dict[int, subprocess.Popen[bytes]] = {}
        try:
            for rank, roles in sorted(ranks.items()):
                out = root / f"tp{rank}"
                out.mkdir()
                argv = _prefill.command(roles, out, rank, PREFILL_TIMEOUT_S)
                with open(out / "prefill.log", "wb") as log:
                    procs[rank] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
                made = {"dir": str(root), "pids": [p.pid for p in procs.values()]}
                ctx.record(**{s.PREFILL.name: made})
        except BaseException:
            _end(list(procs.values()), 0.0)
            raise
        self._helpers = list(procs.values())
        return {s.PREFILL.name: made}

    def stop_prefill(self, ctx: StepContext) -> None:
        """Compensation: ends the helpers (their device memory is freed as they exit)."""
        helpers = getattr(self, "_helpers", None) or []
        pids = (ctx.facts.get(s.PREFILL.name) or {}).get("pids") or []
        _end(helpers, 0.0)
        for pid in pids:  # a resumed machine has no Popen of them: they are not ours to reap
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if _is_prefill(pid):
                    os.kill(pid, signal.SIGKILL)

    def end_prefill(self, ctx: StepContext) -> dict[str, Any]:
        """After the weights were resumed: tells each helper its memory is no longer wanted,
        waits for it to exit (up to 10 s, then ends it); reports whether the engine took it."""
        root = Path(ctx.facts[s.PREFILL.name]["dir"])
        for rank_dir in root.glob("tp*"):  # whatever the engine did, the memory is not wanted
            (rank_dir / _prefill.RELEASE).touch()
        _end(getattr(self, "_helpers", None) or [], 10.0)
        report: dict[str, Any] = {}
        for out in sorted(root.glob("tp*/*")):
            if not out.is_dir():
                continue
            state = "consumed" if (out / _prefill.CONSUMED).exists() else "not used"
            if (out / _prefill.FAILED).exists():
                state = "failed: " + (out / _prefill.FAILED).read_text()[:500]
            report[f"{out.parent.name}/{out.name}"] = state
        return {s.PREFILL_REPORT.name: report}


def _end(procs: list[subprocess.Popen[bytes]], grace: float) -> None:
    """Waits up to `grace` seconds for each helper to exit, then kills and reaps it."""
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _is_prefill(pid: int) -> bool:
    try:
        return _prefill.__name__.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class RecoveryProvider:
    """A pinned checkpoint: the model's files must be those the capture was bound to; the
    engine reloads its weights from them."""

    name = "recovery"
    capabilities = frozenset({"checkpoint"})

    def export(self, ctx: StepContext) -> None:
        """Never selected: the export step is guarded by capability `payload`."""
        raise ComponentError(
            f"provider '{self.name}' exports no payload (capabilities: checkpoint); the spec "
            f"selected step '{ctx.step.name}' for it"
        )

    def discard_export(self, ctx: StepContext) -> None:
        """Never selected, like `export`."""
        raise ComponentError(
            f"provider '{self.name}' exports no payload; nothing to discard in step "
            f"'{ctx.step.name}'"
        )

    def prefill(self, ctx: StepContext) -> None:
        """Never selected: the prefill steps are guarded by capability `payload`."""
        raise ComponentError(f"provider '{self.name}' has no payload to prefill")

    stop_prefill = end_prefill = prefill

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
        source = {"provider": self.name, "checkpoint": path}
        draft_pins: dict[str, str] = ctx.facts.get(s.CAPSULE_DRAFT_CHECKPOINT.name) or {}
        if draft_pins:
            draft = getattr(ctx.request, "draft", None)
            if draft is None:
                raise CheckpointError(
                    "draft", ["the capsule serves a speculative draft model: name its checkpoint"]
                )
            _check_pins("draft.path", draft.path, draft_pins)
            source["draft_checkpoint"] = draft.path
        return {
            s.WEIGHT_SOURCE.name: source,
            s.CHECKPOINT_FILES.name: len(pinned) + len(draft_pins),
        }


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
        doc="the engine's own final storages, exported at release and hydrated in place",
    )
    registry.register_provider(
        "recovery",
        build=build_recovery,
        doc="the pinned checkpoint, checked by digest and reloaded by the engine",
    )


__all__ = ["NativeProvider", "RecoveryProvider", "build_native", "build_recovery", "register"]
