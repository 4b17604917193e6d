"""The store's machine-side steps: seal a capture into the content-addressed store, undo a seal,
and admit a capsule for restore (compatibility first, then its files laid out for the driver).

The store knows no driver, provider or engine by name: it keeps the facts the capture spec
declares `carried`, seals a payload when an earlier step made one, and asks the engine adapter
which build is installed here (`engine.build()`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs

import coldsnap
from coldsnap.artifacts import (
    BLOCK_BYTES,
    Capsule,
    Difference,
    EngineBuild,
    FileDigest,
    Identity,
    IncompatibleArtifact,
    IntegrityError,
    Member,
    ModelBinding,
    Platform,
    RecordError,
    ShapeCoverage,
    SnapshotDriver,
    Store,
    StoreError,
    Topology,
    check_compatible,
    checkpoint_digests,
    collect_platform,
    from_json,
    record_digest,
    sha256_file,
    sha256_range,
    to_json,
)
from coldsnap.machine import Engine, InstalledBuild, LifecycleRequest, Skipped, StepContext
from coldsnap.machine import steps as s

from ._record import RECORD_NAME, CaptureRecord, read_record
from ._verified import Seen, VerifiedObjects, ours_alone

IMAGE_ROLE, IMAGE_PREFIX = "process-image", "image"
PAYLOAD_ROLE, PAYLOAD_PREFIX = "payload", "payload"
RECORD_ROLE = "record"
LAYOUT_IMAGE, LAYOUT_PAYLOAD = "image", "payload"
"""Where admit lays a capsule out under the restore's workdir."""


class StoreArtifacts:
    """Seals into and admits from the `Store` at the request's `store` path. `engine` is the
    engine adapter: its `build()` names the engine installed here, bound into every capsule
    and checked on admit."""

    name = "store"
    capabilities: frozenset[str] = frozenset()

    def __init__(self, engine: Engine, verified: VerifiedObjects | None = None) -> None:
        self.engine = engine
        # Objects this node verified in full are not re-hashed while their inode is unchanged.
        self.verified = verified if verified is not None else VerifiedObjects()

    # -- capture ------------------------------------------------------------------------------

    def seal(self, ctx: StepContext) -> dict[str, Any]:
        """Adopts the process image (and the payload, when an earlier step exported one) into
        the store, adds the capture record and identity, and publishes the capsule under the
        request's name. Whether this capture created the capsule, and what the name pointed to
        before, are recorded before publishing: a rollback must know what it owns.

        The slow parts run side by side: the trees' files (on many threads, each byte read
        once), the model checkpoint's digests (one sha256 pass per file, GBs), and on this
        thread the engine's build and the platform (a first call of each imports: the engine,
        to digest its contracts; torch)."""
        request = ctx.request
        store = Store(request.store)
        # The image's blocks are what admission checks: hashed here, so the first admit need not.
        trees = [_Tree(Path(ctx.facts[s.IMAGE_DIR.name]), IMAGE_ROLE, IMAGE_PREFIX, blocks=True)]
        payload = ctx.facts.get(s.PAYLOAD_DIR.name)  # made only by a provider with a payload
        if payload is not None:
            trees.append(_Tree(Path(payload), PAYLOAD_ROLE, PAYLOAD_PREFIX, blocks=False))
        with ThreadPoolExecutor(2, "coldsnap-seal-side") as side:
            checkpoints = side.submit(_checkpoints, request)
            sealing = side.submit(_seal_trees, ctx, store, trees, self.verified)
            build = self.engine.build()  # imports stay on the caller's thread
            platform = collect_platform()
            members = sealing.result()
            files = checkpoints.result()
        record = CaptureRecord(
            driver=request.driver,
            provider=request.provider,
            engine=request.engine,
            model_id=request.model.id,
            revision=request.model.revision,
            facts=carried_facts(ctx),
            engine_args=tuple(request.engine_args),
            engine_options=dict(request.engine_options),
            serve_port=getattr(request, "serve_port", None),  # older doubles lack them
            serve_host=getattr(request, "serve_host", None),
        )
        data = to_json(record)
        members.append(Member(RECORD_ROLE, RECORD_NAME, store.put_bytes(data), len(data)))
        identity = self._identity(ctx, members, files, build, platform)
        capsule = Capsule(members=tuple(members), identity=identity)
        digest = record_digest(capsule)
        tag = request.name or None
        ctx.record(
            **{
                s.CAPSULE_DIGEST.name: digest,
                s.CAPSULE_CREATED.name: digest not in store.capsules(),
                s.CAPSULE_TAG_WAS.name: store.tags().get(tag) if tag else None,
            }
        )
        published = store.publish(capsule, tag=tag)
        if published != digest:
            raise StoreError(f"the store published capsule {published}, expected {digest}")
        return {s.CAPSULE_DIGEST.name: digest, s.CAPSULE_BYTES.name: sum(m.size for m in members)}

    def unpublish(self, ctx: StepContext) -> None:
        """Undoes seal: removes the capsule unless it existed before this capture, and points
        the request's name back at what it named before."""
        digest = ctx.facts.get(s.CAPSULE_DIGEST.name)
        if digest is None:
            return  # the seal failed before it chose a capsule: nothing was published
        store = Store.open(ctx.request.store)
        if ctx.facts.get(s.CAPSULE_CREATED.name) and digest in store.capsules():
            store.unpublish(digest)
        name, previous = ctx.request.name, ctx.facts.get(s.CAPSULE_TAG_WAS.name)
        if name and previous and previous != digest and previous in store.capsules():
            store.tag(name, previous)

    def _identity(
        self,
        ctx: StepContext,
        members: list[Member],
        files: _Checkpoints | None = None,
        build: InstalledBuild | None = None,
        platform: Platform | None = None,
    ) -> Identity:
        """What the capsule binds. `build` (the engine's), `files` (the checkpoints' digests) and
        `platform` are taken here when the caller has not taken them yet."""
        build = build if build is not None else self.engine.build()
        files = files if files is not None else _checkpoints(ctx.request)
        platform = platform if platform is not None else collect_platform()
        request = ctx.request
        model = request.model
        checkpoint, draft_files = files
        indexes = [m for m in members if m.role == PAYLOAD_ROLE and m.name.endswith("index.json")]
        layout = indexes[0].digest if indexes else _files_digest(checkpoint)
        identity = Identity(
            engine=EngineBuild(build.engine, build.version, build.contract, build.sources),
            plugin_digest=build.plugin_digest,
            model=_binding(model, checkpoint, layout),
            topology=Topology(request.tp, 1, 0, request.tp),
            platform=platform,
            snapshot=SnapshotDriver(request.driver, coldsnap.__version__),
        )
        draft = getattr(request, "draft", None)  # older doubles lack it
        if draft is not None and draft_files is not None:
            identity = attrs.evolve(identity, draft=_binding(draft, draft_files, None))
        coverage = ctx.facts.get(s.SHAPE_COVERAGE.name)
        if coverage is not None:
            shapes = from_json(coverage, ShapeCoverage)  # RecordError names a malformed field
            identity = attrs.evolve(identity, shapes=shapes)
        return identity

    # -- restore ------------------------------------------------------------------------------

    def admit(self, ctx: StepContext) -> dict[str, Any]:
        """Loads the capsule the request names, refuses it unless it was captured with the
        request's driver, provider and engine and its identity fits this runtime, then lays out
        its process image (and payload, if it has one) under the workdir and rehashes every
        file laid out against the manifest (`_lay_out`)."""
        request = ctx.request
        store = Store.open(request.store)
        digest = store.resolve(request.artifact)
        capsule = store.capsule(digest)
        record = _read_record(store, capsule, request.artifact)
        wrong = [
            Difference(name, captured, wanted)
            for name, captured, wanted in (
                ("driver", record.driver, request.driver),
                ("provider", record.provider, request.provider),
                ("engine", record.engine, request.engine),
            )
            if captured != wanted
        ]
        if wrong:
            raise _mismatch(request.artifact, "was captured with other components", wrong)
        if capsule.identity is None:
            raise IncompatibleArtifact(
                [], f"capsule {request.artifact} has no identity to check this runtime against"
            )
        _check_request_binds(self.engine, request, capsule.identity, record)
        check_compatible(capsule.identity, self._runtime(ctx, capsule.identity))
        members, payload = capsule.by_role(IMAGE_ROLE), capsule.by_role(PAYLOAD_ROLE)
        meter = _Meter(ctx, "verified", sum(m.size for m in (*members, *payload)))
        t0 = time.perf_counter()
        image = self._lay_out(store, members, IMAGE_PREFIX, ctx.workdir / LAYOUT_IMAGE, meter)
        verify_seconds = time.perf_counter() - t0
        facts: dict[str, Any] = {
            s.VERIFY_IMAGE_SECONDS.name: verify_seconds,
            s.CAPSULE_DIGEST.name: digest,
            s.CAPSULE.name: {**record.facts, "driver": record.driver, "model_id": record.model_id},
            s.IMAGE_DIR.name: str(image),
            s.CAPSULE_CHECKPOINT.name: {
                f.name: f.sha256 for f in capsule.identity.model.checkpoint
            },
            s.CAPSULE_DRAFT_CHECKPOINT.name: {
                f.name: f.sha256
                for f in (capsule.identity.draft.checkpoint if capsule.identity.draft else ())
            },
        }
        if payload:
            dest = ctx.workdir / LAYOUT_PAYLOAD
            laid_out = self._lay_out(store, payload, PAYLOAD_PREFIX, dest, meter)
            facts[s.PAYLOAD_DIR.name] = str(laid_out)
        return facts

    def _lay_out(
        self,
        store: Store,
        members: tuple[Member, ...],
        prefix: str,
        dest: Path,
        meter: Callable[[int], None],
    ) -> Path:
        """Lays `members` out under `dest` and rehashes them there against the manifest (every
        member a restore reads: the process image, and the payload's packs and their index,
        whose checksums are all a later stage checks the packs by). Nothing unverified stays
        laid out."""
        _link_tree(store, members, prefix, dest)
        try:
            verify_layout(members, prefix, dest, self.verified, meter)
        except IntegrityError:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        return dest

    def discard_layout(self, ctx: StepContext) -> Skipped | None:
        """Undoes admit: removes the image and payload it laid out under the workdir (hard
        links or copies; the store's objects stay); in a stop, under its target's workdir.
        Idempotent; Skipped where nothing is laid out (a capture's workdir, a second run)."""
        root = ctx.workdir
        if isinstance(ctx.request, LifecycleRequest):
            root = Path(ctx.request.target)
        laid_out = [root / sub for sub in (LAYOUT_IMAGE, LAYOUT_PAYLOAD) if (root / sub).exists()]
        if not laid_out:
            return Skipped(f"nothing is laid out under {root}")
        for path in laid_out:
            shutil.rmtree(path)
        return None

    def _runtime(self, ctx: StepContext, captured: Identity) -> Identity:
        """This host's identity: the captured model, with what this host decides itself. An
        engine build that records its source files is checked by them (the engine raises
        IncompatibleArtifact naming a changed one; nothing is imported); one that records none
        (an identity of format 1, an engine that keeps none) is taken again from the engine."""
        recorded = captured.engine
        if recorded.sources:
            build = self.engine.build(
                InstalledBuild(
                    engine=recorded.name,
                    version=recorded.version,
                    contract=recorded.contract_digest,
                    plugin_digest=captured.plugin_digest,
                    sources=dict(recorded.sources),
                )
            )
        else:
            build = self.engine.build()
        sources = build.sources if recorded.sources else {}
        return Identity(
            engine=EngineBuild(build.engine, build.version, build.contract, sources),
            format=captured.format,  # compared in the capture's terms
            plugin_digest=build.plugin_digest,
            model=captured.model,
            topology=captured.topology,
            platform=collect_platform(),
            snapshot=SnapshotDriver(ctx.request.driver, coldsnap.__version__),
            draft=captured.draft,  # the request's draft is checked by _check_request_binds
            shapes=captured.shapes,  # what the image holds warm: a fact of the capture
        )


def _check_request_binds(
    engine: Engine, request: Any, identity: Identity, record: CaptureRecord
) -> None:
    """Every field the capsule binds that the restore request also names must be the same:
    the model (id and revision), the topology (tp), the engine arguments that change the
    engine (the engine adapter says which may differ: `engine_args_differences`) and the
    engine options (`engine_options_differences`). Refused before anything runs, naming each
    field with the captured and the requested value."""
    wrong = list(engine.engine_args_differences(record.engine_args, request.engine_args))
    wrong += engine.engine_options_differences(record.engine_options, request.engine_options)
    model = request.model
    if model is not None:
        for name, captured, wanted in (
            ("model.id", identity.model.model_id, model.id),
            ("model.revision", identity.model.revision, model.revision),
        ):
            if captured != wanted:
                wrong.append(Difference(name, captured, wanted))
    if request.tp is not None and request.tp != identity.topology.tp:
        wrong.append(Difference("tp", identity.topology.tp, request.tp))
    wrong += _draft_differences(identity.draft, getattr(request, "draft", None))
    if wrong:
        raise _mismatch(
            request.artifact, "binds another model, topology or engine arguments", wrong
        )


def _draft_differences(captured: ModelBinding | None, draft: Any) -> list[Difference]:
    """A draft the restore request names must be the captured one (id and revision); a
    request naming none takes the captured draft (n610 holds it; a recovery then refuses to
    reload a draft it has no path for)."""
    if draft is None:
        return []
    if captured is None:
        return [Difference("draft", None, f"{draft.id}@{draft.revision}")]
    return [
        Difference(f"draft.{name}", want, have)
        for name, want, have in (
            ("id", captured.model_id, draft.id),
            ("revision", captured.revision, draft.revision),
        )
        if want != have
    ]


def _mismatch(artifact: str, what: str, wrong: list[Difference]) -> IncompatibleArtifact:
    """The refusal naming each field the capsule and the request disagree on."""
    return IncompatibleArtifact(
        wrong,
        f"capsule {artifact} {what} than the request names (expected: the capsule's, found: "
        "the request's):\n  " + "\n  ".join(str(d) for d in wrong),
    )


VERIFY_THREADS = min(16, os.cpu_count() or 1)


class _Meter:
    """Bytes done of `total`, shown through the step's context as they grow (from any
    thread): what an operator watching a multi-GB seal or verification sees."""

    def __init__(self, ctx: StepContext, what: str, total: int) -> None:
        self._ctx, self._what, self._total, self._done = ctx, what, total, 0
        self._started = time.monotonic()
        self._lock = threading.Lock()

    def __call__(self, n: int) -> None:
        with self._lock:
            self._done += n
            self._ctx.advance(self._what, self._done, self._total, self._started)


def verify_layout(
    members: Iterable[Member],
    prefix: str,
    dest: Path,
    verified: VerifiedObjects | None = None,
    meter: Callable[[int], None] | None = None,
) -> int:
    """Rehashes every member as laid out under `dest` (the bytes the driver will read: a hard
    link shares the store object's inode, a copy is what was copied) against the manifest: its
    size, then each block's sha256 (a member sealed with `blocks`) or its whole sha256. Blocks
    of every member are checked on VERIFY_THREADS threads (sha256 releases the GIL), so one
    multi-GB pages image is checked on many cores. IntegrityError names every bad member.

    With `verified`, a member laid out as the very inode, untouched, that this node already
    verified is not hashed again, and members hashed now are remembered there (_verified).
    `meter` is told the bytes of each piece checked (or skipped as already verified). Returns
    the bytes hashed."""
    todo = list(members)
    problems: dict[str, str] = {}
    tasks: list[tuple[Member, Path, int | None]] = []
    hashed: list[tuple[Member, Path, Seen]] = []
    for member in todo:
        path = dest / member.name.removeprefix(prefix + "/")
        if verified is not None and verified.unchanged(member.digest, path):
            if meter is not None:
                meter(member.size)
            continue
        try:
            seen = Seen.of(path, follow_symlinks=False)
        except OSError as exc:
            problems[member.name] = f"member {member.name!r}: {exc.strerror}"
            continue
        hashed.append((member, path, seen))
        size = seen.size
        if size != member.size:
            problems[member.name] = (
                f"member {member.name!r}: {size} bytes, the manifest says {member.size}"
            )
        elif member.blocks:
            tasks += [(member, path, b) for b in range(len(member.blocks))]
        else:
            tasks.append((member, path, None))

    def one(task: tuple[Member, Path, int | None]) -> tuple[str, str] | None:
        member, path, block = task
        if block is None:
            found = _hash_file(path)
            bad = found != member.digest
            done, why = member.size, f"its bytes hash to {found}, not {member.digest}"
        else:
            bad = _hash_block(path, block) != member.blocks[block]
            done = min(BLOCK_BYTES, member.size - block * BLOCK_BYTES)
            why = f"block {block} (bytes from {block * BLOCK_BYTES}) differs"
        if meter is not None:
            meter(done)
        return (member.name, why) if bad else None

    with ThreadPoolExecutor(_threads(len(tasks)), "coldsnap-verify") as pool:
        for bad in pool.map(one, tasks):
            if bad is not None and bad[0] not in problems:
                problems[bad[0]] = f"member {bad[0]!r}: {bad[1]}"
    if problems:
        raise IntegrityError(
            f"{len(problems)} of {len(todo)} members laid out under {dest} are damaged:\n  "
            + "\n  ".join(problems[name] for name in sorted(problems))
        )
    if verified is not None:
        for member, path, seen in hashed:
            verified.remember(member.digest, path, seen)
    return sum(seen.size for _, _, seen in hashed)


def _threads(tasks: int) -> int:
    return max(1, min(VERIFY_THREADS, tasks))


def _hash_block(path: Path, block: int) -> str:
    """The hex sha256 of one BLOCK_BYTES block of the file at `path` (links refused)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return sha256_range(fd, block * BLOCK_BYTES, (block + 1) * BLOCK_BYTES)
    finally:
        os.close(fd)


def _hash_file(path: Path) -> str:
    return sha256_file(path, follow_symlinks=False)


def carried_facts(ctx: StepContext) -> dict[str, Any]:
    """The facts this spec declares `carried` that the capture's steps made."""
    return ctx.carried()


@attrs.frozen
class _Tree:
    """A directory to seal: its files become members `<prefix>/<relative path>` of `role`;
    with `blocks`, each carries the sha256 of every BLOCK_BYTES block (what admission checks)."""

    root: Path
    role: str
    prefix: str
    blocks: bool


_Checkpoints = tuple[tuple[FileDigest, ...], tuple[FileDigest, ...] | None]
"""The digests of the model's checkpoint files, and of its speculative draft's when it has one."""


def _checkpoints(request: Any) -> _Checkpoints:
    draft = getattr(request, "draft", None)  # older doubles lack it
    model_files = checkpoint_digests(request.model.path)
    return model_files, (checkpoint_digests(draft.path) if draft is not None else None)


def _seal_trees(
    ctx: StepContext, store: Store, trees: list[_Tree], verified: VerifiedObjects | None
) -> list[Member]:
    """Takes every file under `trees` into the store (`Store.take`: moved when on the store's
    filesystem, copied otherwise; each byte read once, for the object's name and its blocks),
    many files at once, the largest first: a multi-GB image or pack costs one sha256 pass on one
    core while the rest are sealed on the others. Members come back in tree order, then by
    path. An image object whose inode this seal hashed is remembered in `verified`, so that an
    admit on this node does not hash it again while it is unchanged (coldsnap.capsules.
    _verified). If a file fails, the files not started are left where they were."""
    jobs: list[tuple[_Tree, Path, int]] = []
    for tree in trees:
        if not tree.root.is_dir():
            raise StoreError(f"{tree.root} is not a directory: nothing to seal as {tree.role}")
        files = sorted(p for p in tree.root.rglob("*") if p.is_file())
        jobs += [(tree, path, path.stat().st_size) for path in files]
    sealed = _Meter(ctx, "sealed", sum(size for _, _, size in jobs))
    blocks = _Meter(ctx, "hashed image blocks", sum(n for t, _, n in jobs if t.blocks))

    def one(job: tuple[_Tree, Path, int]) -> Member:
        tree, path, _ = job

        def progress(n: int) -> None:
            sealed(n)
            if tree.blocks:
                blocks(n)

        taken = store.take(
            path,
            block_bytes=BLOCK_BYTES if tree.blocks else None,
            helpers=helpers,
            syncs=syncs,
            progress=progress,
        )
        # A copy from another filesystem leaves its source: a second copy of the engine's
        # memory in the capture's workdir. Taken in, it goes, as a move would have taken it.
        path.unlink(missing_ok=True)
        if verified is not None and (st := taken.hashed) is not None:
            seen = Seen(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            verified.remember(taken.digest, store.path(taken.digest), seen)
        name = f"{tree.prefix}/{path.relative_to(tree.root).as_posix()}"
        return Member(tree.role, name, taken.digest, taken.size, blocks=taken.blocks)

    order = sorted(range(len(jobs)), key=lambda i: -jobs[i][2])
    with (
        ThreadPoolExecutor(VERIFY_THREADS, "coldsnap-seal-helper") as helpers,
        ThreadPoolExecutor(_threads(len(jobs)), "coldsnap-seal-sync") as syncs,
        ThreadPoolExecutor(_threads(len(jobs)), "coldsnap-seal") as pool,
    ):
        futures = {i: pool.submit(one, jobs[i]) for i in order}
        try:
            members = [futures[i].result() for i in range(len(jobs))]
        except BaseException:
            for future in futures.values():
                future.cancel()
            raise
    return members


def _link_tree(store: Store, members: Iterable[Member], prefix: str, dest: Path) -> Path:
    """Lays members out under `dest` (folders 0700): as hard links to the store's objects where
    only this user can write them, as private copies (0600) where another user could (a store
    that user made: what is verified must be what is read, and its owner could change a linked
    file between the two) or where `dest` is on another filesystem. A file already there is
    kept: a retried admit resumes (and verifies it like the rest)."""
    for member in members:
        target = dest / member.name.removeprefix(prefix + "/")
        if target.exists():
            continue
        _private_dirs(dest, target.parent)
        source = store.path(member.digest)
        if ours_alone(os.lstat(source)):
            try:
                os.link(source, target)
                continue
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
        os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        try:
            shutil.copyfile(source, partial)  # into the private file made above: stays 0600
            os.replace(partial, target)  # never a half-copied file under the final name
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    return dest


def _private_dirs(top: Path, leaf: Path) -> None:
    """Makes `top` (and any folder above it that is missing) and the folders under it down to
    `leaf`, each 0700."""
    top.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = top
    for part in leaf.relative_to(top).parts:
        path = path / part
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)


def _read_record(store: Store, capsule: Capsule, artifact: str) -> CaptureRecord:
    records = [m for m in capsule.members if m.role == RECORD_ROLE and m.name == RECORD_NAME]
    if not records:
        raise RecordError(f"capsule {artifact}", [("members", f"no {RECORD_NAME} member")])
    return read_record(store.read_bytes(records[0].digest))


def _binding(model: Any, checkpoint: tuple[FileDigest, ...], layout: str | None) -> ModelBinding:
    """What a capsule binds of one model (the target, or a speculative draft): its pinned
    files, dtype and quantization, and its tensors' layout (the checkpoint's files without a
    payload index)."""
    config = _model_config(Path(model.path))
    return ModelBinding(
        model.id,
        model.revision,
        checkpoint,
        str(config.get("torch_dtype") or config.get("dtype") or "unspecified"),
        str((config.get("quantization_config") or {}).get("quant_method", "none")),
        layout or _files_digest(checkpoint),
    )


def _model_config(path: Path) -> dict[str, Any]:
    """The model's config.json; a checkpoint without one binds dtype and quantization as
    unspecified."""
    config = path / "config.json"
    if not config.exists():
        return {}
    try:
        data = json.loads(config.read_text())
    except ValueError as exc:
        raise RecordError(str(config), [("$", f"not JSON: {exc}")]) from None
    if not isinstance(data, dict):
        raise RecordError(str(config), [("$", "a model config is a JSON object")])
    return data


def _files_digest(files: Iterable[FileDigest]) -> str:
    """The layout of a capture without a payload: its checkpoint files, by name and digest."""
    text = "\n".join(f"{f.name} {f.sha256}" for f in files)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


__all__ = ["StoreArtifacts", "carried_facts"]
