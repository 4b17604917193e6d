"""The artifact steps of the machines: seal a capture into the content-addressed store, undo a
seal, and admit a capsule for restore (compatibility, then its files laid out for the driver)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from attrs import frozen

import coldsnap
from coldsnap.artifacts import (
    Capsule,
    EngineBuild,
    Identity,
    Member,
    ModelBinding,
    SnapshotDriver,
    Store,
    Topology,
    capture_identity,
    check_compatible,
    checkpoint_digests,
    collect_platform,
    converter,
    record_digest,
)
from coldsnap.machine import StepContext
from coldsnap.plugin import plugin_digest

RECORD_NAME = "capture.json"
_CARRIED = (
    "acceptance_tokens",
    "engine_url",
    "runtime_dir",
    "cuda_pids",
    "template_id",
    "forkserver_address",
    "image_bytes",
)


@frozen(kw_only=True)
class CaptureRecord:
    """What a restore needs besides the files: how the capture's engine answered and where it
    listened, and the facts the drivers carry from capture to restore."""

    driver: str
    provider: str
    engine: str
    model_id: str
    revision: str
    facts: dict[str, Any]
    format: int = 1
    kind: str = "coldsnap.capture-record"


class StoreArtifacts:
    """Seals into and admits from a `Store` at the request's `store` path."""

    name = "store"

    def __init__(self, engine: Any) -> None:
        self.engine = engine  # its build() names the engine installed here

    def _store(self, ctx: StepContext) -> Store:
        return Store(ctx.request.store)

    # -- capture ------------------------------------------------------------------------------

    def seal(self, ctx: StepContext) -> dict[str, Any]:
        store = self._store(ctx)
        members = _adopt_tree(store, Path(ctx.facts["image_dir"]), "process-image", "image")
        if ctx.request.provider == "native":
            members += _adopt_tree(store, Path(ctx.facts["payload_dir"]), "payload", "payload")
        record = CaptureRecord(
            driver=ctx.request.driver,
            provider=ctx.request.provider,
            engine=ctx.request.engine,
            model_id=ctx.request.model.id,
            revision=ctx.request.model.revision,
            facts={k: ctx.facts[k] for k in _CARRIED if ctx.facts.get(k) is not None},
        )
        data = json.dumps(converter.unstructure(record), sort_keys=True).encode()
        members.append(Member("record", RECORD_NAME, store.put_bytes(data), len(data)))
        capsule = Capsule(members=tuple(members), identity=self._identity(ctx, members))
        digest = record_digest(capsule)
        created = digest not in store.capsules()
        previous = store.tags().get(ctx.request.name) if ctx.request.name else None
        # Recorded before publishing: a rollback must know whether it owns the capsule.
        ctx.record(capsule_digest=digest, capsule_created=created, capsule_tag_was=previous)
        published = store.publish(capsule, tag=ctx.request.name or None)
        assert published == digest, (published, digest)
        return {"capsule_digest": digest, "capsule_bytes": sum(m.size for m in members)}

    def unpublish(self, ctx: StepContext) -> None:
        """Leaves a capsule that existed before this capture, and gives its tag back."""
        digest = ctx.facts.get("capsule_digest")
        if not digest:
            return
        store = self._store(ctx)
        name, previous = ctx.request.name, ctx.facts.get("capsule_tag_was")
        if ctx.facts.get("capsule_created") and digest in store.capsules():
            store.unpublish(digest)
        if name and previous and previous != digest and previous in store.capsules():
            store.tag(name, previous)

    def _identity(self, ctx: StepContext, members: list[Member]) -> Identity:
        engine, version, contract = self.engine.build()
        model = ctx.request.model
        payload = [m for m in members if m.name.endswith("index.json") and m.role == "payload"]
        checkpoint = checkpoint_digests(model.path)
        layout = payload[0].digest if payload else _digest_of(checkpoint)
        config = _config(Path(model.path))
        return capture_identity(
            engine=EngineBuild(engine, version, contract),
            plugin_digest=plugin_digest(),
            model=ModelBinding(
                model.id,
                model.revision,
                checkpoint,
                str(config.get("torch_dtype") or config.get("dtype") or "unspecified"),
                str((config.get("quantization_config") or {}).get("quant_method", "none")),
                layout,
            ),
            topology=Topology(ctx.request.tp, 1, 0, ctx.request.tp),
            snapshot=SnapshotDriver(ctx.request.driver, coldsnap.__version__),
        )

    # -- restore ------------------------------------------------------------------------------

    def admit(self, ctx: StepContext) -> dict[str, Any]:
        store = self._store(ctx)
        digest = store.resolve(ctx.request.artifact)
        capsule = store.capsule(digest)
        record = converter.structure(
            json.loads(store.read_bytes(capsule.member(RECORD_NAME).digest)), CaptureRecord
        )
        if record.driver != ctx.request.driver or record.provider != ctx.request.provider:
            raise ValueError(
                f"capsule {ctx.request.artifact} was captured with driver {record.driver} and "
                f"provider {record.provider}; the request asks for {ctx.request.driver} and "
                f"{ctx.request.provider}"
            )
        if capsule.identity is not None:
            check_compatible(capsule.identity, self._runtime(ctx, capsule.identity))
        image = _link_tree(store, capsule, "process-image", "image", ctx.workdir / "image")
        pinned = capsule.identity.model.checkpoint if capsule.identity is not None else ()
        facts: dict[str, Any] = {
            "capsule_digest": digest,
            "capsule": {**record.facts, "driver": record.driver, "model_id": record.model_id},
            "image_dir": str(image),
            "capsule_checkpoint": {f.name: f.sha256 for f in pinned},
        }
        if record.provider == "native":
            payload = _link_tree(store, capsule, "payload", "payload", ctx.workdir / "payload")
            facts["payload_dir"] = str(payload)
        return facts

    def _runtime(self, ctx: StepContext, captured: Identity) -> Identity:
        """This host's identity: the captured model, with what this host decides itself."""
        engine, version, contract = self.engine.build()
        return Identity(
            engine=EngineBuild(engine, version, contract),
            plugin_digest=plugin_digest(),
            model=captured.model,
            topology=captured.topology,
            platform=collect_platform(),
            snapshot=SnapshotDriver(ctx.request.driver, coldsnap.__version__),
        )


def _adopt_tree(store: Store, root: Path, role: str, prefix: str) -> list[Member]:
    """Moves every file under `root` into the store (same filesystem: no copy)."""
    members = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        size = path.stat().st_size
        try:
            digest = store.adopt(path)
        except Exception:  # another filesystem: copy instead
            digest = store.put_file(path)
        members.append(Member(role, f"{prefix}/{path.relative_to(root).as_posix()}", digest, size))
    return members


def _link_tree(store: Store, capsule: Capsule, role: str, prefix: str, dest: Path) -> Path:
    """Lays a capsule's files out under `dest` as hard links to the store's objects."""
    for member in capsule.by_role(role):
        target = dest / member.name.removeprefix(prefix + "/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            continue
        try:
            os.link(store.path(member.digest), target)
        except OSError:
            target.write_bytes(store.read_bytes(member.digest))
    return dest


def _config(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _digest_of(files: Any) -> str:
    import hashlib

    text = "\n".join(f"{f.name} {f.sha256}" for f in files)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
