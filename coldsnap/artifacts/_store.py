"""A content-addressed object store in one local directory.

Layout (directories 0700, files 0600, no symlinks anywhere):

    objects/sha256/ab/<62 hex>   immutable objects, named by the sha256 of their bytes
    capsules/<64 hex>            published capsules: an empty marker per capsule manifest
    tags/<tag>                   a TagRecord naming a capsule (`tiny-llama` -> sha256:...)
    tmp/                         files being written; renamed into objects/ when complete
    locks/                       file locks (filelock): 256 object shards and the store lock

Every object is written to tmp/, fsynced, then renamed: a reader never sees a partial object.
A capsule becomes visible only when its marker is renamed into capsules/, after its manifest
and every member are durable: a reader never sees a partial capsule.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from attrs import frozen
from filelock import FileLock

from coldsnap import _atomic

from . import _fs
from ._capsule import Capsule, TagRecord
from ._convert import from_json, to_json
from ._errors import IntegrityError, NoCapsule, RecordError, StoreError
from ._hashing import CHUNK, sha256_fd
from ._names import DIGEST_PREFIX, digest_problem, short_digest, tag_problem

_SENDFILE_BYTES = 1 << 30
_HEX = frozenset("0123456789abcdef")


@frozen
class VerifyReport:
    """What `Store.verify` found: how many objects it rehashed and each bad one with why."""

    checked: int
    bad: tuple[tuple[str, str], ...]

    @property
    def ok(self) -> bool:
        return not self.bad


@frozen
class Taken:
    """What `Store.take` put in: the object, its size, the sha256 (hex) of each block when
    asked, and the stat of the inode it hashed, taken before the hash, when that inode is now the
    object (None when an equal object was already there: that one's bytes were not read)."""

    digest: str
    size: int
    blocks: tuple[str, ...]
    hashed: os.stat_result | None


@frozen
class Tally:
    """A number of objects and their bytes."""

    count: int = 0
    bytes: int = 0

    def add(self, size: int) -> Tally:
        return Tally(self.count + 1, self.bytes + size)


@frozen(kw_only=True)
class GcReport:
    """What `Store.gc` did and, for each thing it left, why: so "removed 0" is never the whole
    answer. `kept` is every object left; `reached` those a published capsule names, `young`
    the unreachable ones within the grace. Capsules: `unpublished` (untagged, past the grace),
    and the untagged ones kept, `young_capsules` (within the grace) and `in_use_capsules`."""

    removed: tuple[str, ...]
    freed_bytes: int
    kept: int
    reached: Tally = Tally()
    young: Tally = Tally()
    unpublished: tuple[str, ...] = ()
    young_capsules: tuple[str, ...] = ()
    in_use_capsules: tuple[str, ...] = ()


@frozen(kw_only=True)
class Removed:
    """What `Store.remove` did: the capsule unpublished, the tags that named it, the objects it
    freed at once (only it reached them, untouched since it was published) and those it left:
    `shared` (another capsule names them), `touched` (written again since it was published: a
    capture in progress may be taking them; gc frees them after its grace). `unread` says why
    nothing was freed when the capsules could not all be read (gc frees it later)."""

    digest: str
    tags: tuple[str, ...]
    freed: tuple[str, ...]
    freed_bytes: int
    shared: Tally = Tally()
    touched: Tally = Tally()
    unread: str | None = None


class ObjectWriter:
    """Streams bytes into a new private temporary file, hashing while writing. `commit()` fsyncs
    it and hands it, with its digest, to `install`, which puts it in place (a store: into
    objects/; an export directory: `<hex>.pack`), and returns the digest: a multi-GB file is
    never read back to be named. Used as a context manager, an uncommitted writer removes its
    temporary file."""

    def __init__(self, tmp: Path, install: Callable[[Path, str], None]) -> None:
        self._tmp = tmp
        self._install = install
        self._fd: int | None = _fs.create_exclusive(tmp)
        self._sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._fd is None:
            raise StoreError("write after commit or abort")
        self._sha.update(data)
        _fs.write_all(self._fd, data)
        self.size += memoryview(data).nbytes

    def commit(self) -> str:
        if self._fd is None:
            raise StoreError("commit after commit or abort")
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        digest = DIGEST_PREFIX + self._sha.hexdigest()
        self._install(self._tmp, digest)
        return digest

    @property
    def path(self) -> Path:
        """The temporary file (where a staged writer's commit leaves it: `Store.staging`)."""
        return self._tmp

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> ObjectWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


LAYOUT = ("objects", "objects/sha256", "capsules", "tags", "tmp", "locks")
"""The store's own folders: a directory holding all of them is a store."""

_TEMPORARY = re.compile(r"[0-9a-f]{32}\.(part|adopt)")
"""The names of the temporary files the store writes in tmp/ (what gc may remove there)."""


class Store:
    """A local content-addressed store of objects and the capsules that name them.

    `Store(root)` is for writers (a capture's seal): it makes the store, or completes one a crash
    left half made, and narrows its folders to 0700; it refuses a directory that holds anything
    but the store's own folders, or that another user owns and is not yet a store, so a
    mistyped path never turns someone's directory into a store. `Store.open(root)` is for
    everything else (read commands, admission, gc): the store must already be there, and
    opening it creates and changes nothing."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True) -> None:
        self.root = Path(root)
        if not create:
            self._check_layout()
            return
        try:
            self.root.parent.mkdir(mode=_fs.DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot make a store at {self.root}: {exc.strerror}") from None
        self._check_makeable()
        _fs.private_dir(self.root)
        for sub in LAYOUT:
            _fs.private_dir(self.root / sub)

    @classmethod
    def open(cls, root: str | os.PathLike[str]) -> Store:
        """An existing store, as it is: StoreError when `root` is not a directory holding the
        store's folders (none is made, no mode is changed)."""
        return cls(root, create=False)

    def _check_layout(self) -> None:
        try:
            st = _fs.refuse_symlink(self.root)
            if st is None:
                raise StoreError(f"no store at {self.root}: it does not exist (a capture makes it)")
            if not stat.S_ISDIR(st.st_mode):
                raise StoreError(f"no store at {self.root}: not a directory")
            missing = []
            for sub in LAYOUT:
                found = _fs.refuse_symlink(self.root / sub)
                if found is None or not stat.S_ISDIR(found.st_mode):
                    missing.append(sub)
            if not missing and not all(
                os.access(self.root / sub, os.R_OK | os.X_OK) for sub in ("capsules", "tags")
            ):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        except PermissionError:
            raise StoreError(self._denied()) from None
        if missing:
            raise StoreError(
                f"{self.root} is not a coldsnap store: it lacks the store's folders "
                f"{', '.join(missing)}"
            )

    def _denied(self) -> str:
        """Why this user cannot read the store: the nearest folder on its path that can be
        looked at, its owner and mode (a store is private to the user who made it, root for
        the default one)."""
        for folder in (self.root, *self.root.parents):
            try:
                st = os.stat(folder)
            except OSError:
                continue
            return (
                f"cannot read the store at {self.root}: permission denied ({folder} belongs to "
                f"uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}; this is uid "
                f"{os.geteuid()}): run it as the store's owner"
                + (" (root: sudo)" if st.st_uid == 0 else "")
            )
        return f"cannot read the store at {self.root}: permission denied"

    def _check_makeable(self) -> None:
        """A directory already at `root` is a store when it holds the store's folders; any other
        may become one only when it holds nothing but some of them (one a crash left half made,
        or an empty directory) and this user owns it."""
        st = _fs.refuse_symlink(self.root)
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode):
            raise StoreError(f"cannot make a store at {self.root}: not a directory")
        if all((self.root / sub).is_dir() for sub in LAYOUT):
            return  # a store (a stray beside its folders is verify's to report)
        top = {sub.split("/")[0] for sub in LAYOUT}
        others = sorted(set(os.listdir(self.root)) - top)
        if others:
            raise StoreError(
                f"{self.root} is not a coldsnap store and not empty (it holds "
                f"{', '.join(others[:3])}{', ...' if len(others) > 3 else ''}): name a new or "
                "empty directory, or an existing store"
            )
        if st.st_uid != os.geteuid():
            raise StoreError(
                f"cannot make a store at {self.root}: the directory belongs to uid {st.st_uid}, "
                "not to this user"
            )

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # objects ------------------------------------------------------------------------------

    def writer(self) -> ObjectWriter:
        return self._temporary(self._install)

    def staging(self) -> ObjectWriter:
        """A writer whose commit fsyncs its file and returns the digest but leaves the file in
        tmp/ (`writer.path`), not yet an object: for a caller that must check several objects
        before any of them may be in the store (a pull). `install_staged` puts it in place;
        `abort()` removes it; one a crash leaves is gc's, as every temporary of the store."""
        return self._temporary(lambda tmp, digest: None)

    def install_staged(self, writer: ObjectWriter, digest: str) -> bool:
        """Installs the committed file of a `staging` writer as `digest` (what its commit
        returned); whether its inode became the object (False when an equal object was there
        already: that one is kept, as for every writer)."""
        tmp = writer.path
        if tmp.parent != self.root / "tmp":
            raise StoreError(f"{tmp} is not a temporary file of the store {self.root}")
        hashed = os.lstat(tmp)
        self._install(tmp, digest)
        now = os.lstat(self._object_path(digest))
        return (now.st_dev, now.st_ino) == (hashed.st_dev, hashed.st_ino)

    def put_bytes(self, data: bytes | bytearray | memoryview) -> str:
        with self.writer() as w:
            w.write(data)
            return w.commit()

    def put_stream(self, stream: BinaryIO) -> str:
        """Copies a readable binary stream in, hashing while copying."""
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        with self.writer() as w:
            while n := stream.readinto(buffer):  # type: ignore[attr-defined]
                w.write(view[:n])
            return w.commit()

    def put_file(self, path: str | os.PathLike[str]) -> str:
        """Copies a file in (any filesystem), hashing while copying."""
        with open(path, "rb", buffering=0) as stream:
            return self.put_stream(stream)

    def adopt(self, path: str | os.PathLike[str], *, keep_original: bool = False) -> str:
        """Takes a large file on the store's filesystem in without copying its bytes: it is
        moved (or, with keep_original, hard-linked) into tmp/, hashed there, then renamed into
        objects/. A kept original shares the object's inode and must not be modified."""
        source = Path(path)
        st = os.lstat(source)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{source} is not a regular file (symlinks are refused)")
        tmp_dir = self.root / "tmp"
        if st.st_dev != os.stat(tmp_dir).st_dev:
            raise StoreError(
                f"{source} is on another filesystem than the store {self.root}; use put_file"
            )
        tmp = tmp_dir / f"{uuid.uuid4().hex}.adopt"
        if keep_original:
            os.link(source, tmp)
        else:
            os.rename(source, tmp)
        try:
            os.chmod(tmp, _fs.FILE_MODE, follow_symlinks=False)
            fd = _fs.open_read(tmp)
            try:
                os.fsync(fd)
                digest = sha256_fd(fd)
            finally:
                os.close(fd)
            self._install(tmp, digest)
        except BaseException:
            if not keep_original and tmp.exists():
                os.rename(tmp, source)  # give the caller's file back untouched
            tmp.unlink(missing_ok=True)
            raise
        return digest

    def take(
        self,
        path: str | os.PathLike[str],
        *,
        block_bytes: int | None = None,
        helpers: Executor | None = None,
        syncs: Executor | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Taken:
        """Takes a file in, its bytes read once by Python: moved in when it is on the store's
        filesystem (as `adopt`: not copied), copied in otherwise (in the kernel, sendfile); then
        the store's private file is hashed in one pass, for its name and, with `block_bytes`,
        each block's sha256. `helpers` runs the block hashes beside that pass (a multi-GB file
        then costs one sha256 pass on this thread), `syncs` the fsync (a pool of its own: an
        fsync may wait seconds for writeback, and must not hold up block hashes); without
        them they run in turn. The file is fsynced before it is renamed into objects/.
        `progress` is told the bytes of each piece hashed. A moved file that fails is given
        back where it was; a copy leaves its source as it was."""
        source = Path(path)
        st = os.lstat(source)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{source} is not a regular file (symlinks are refused)")
        if block_bytes is not None and block_bytes <= 0:
            raise StoreError(f"block_bytes: {block_bytes} is not a positive number of bytes")
        run = helpers.submit if helpers is not None else _now
        tmp_dir = self.root / "tmp"
        if st.st_dev == os.stat(tmp_dir).st_dev:
            tmp = tmp_dir / f"{uuid.uuid4().hex}.adopt"
            try:
                os.rename(source, tmp)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise  # EXDEV: another mount of the same filesystem; copied below
            else:
                try:
                    os.chmod(tmp, _fs.FILE_MODE, follow_symlinks=False)
                    return self._hash_in(source, tmp, block_bytes, run, syncs, progress)
                except BaseException:
                    if tmp.exists():
                        os.rename(tmp, source)  # give the caller's file back untouched
                    raise
        tmp = tmp_dir / f"{uuid.uuid4().hex}.part"
        try:
            _copy_in(source, tmp)
            return self._hash_in(source, tmp, block_bytes, run, syncs, progress)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _hash_in(
        self,
        source: Path,
        tmp: Path,
        block_bytes: int | None,
        run: Callable[..., Future[object]],
        syncs: Executor | None,
        progress: Callable[[int], None] | None,
    ) -> Taken:
        """Hashes a private temporary file while it is fsynced (the writeback overlaps the hash),
        installs it, and says whether its inode became the object."""
        fd = _fs.open_read(tmp)
        try:
            hashed = os.fstat(fd)
            synced = syncs.submit(os.fsync, fd) if syncs is not None else None
            try:
                digest, size, blocks = _one_pass(source, fd, block_bytes, run, progress)
            except BaseException:
                if synced is not None:
                    synced.exception()  # the fd is closed below: let the fsync end first
                raise
            if synced is None:
                os.fsync(fd)
            else:
                synced.result()
        finally:
            os.close(fd)
        self._install(tmp, digest)
        now = os.lstat(self._object_path(digest))
        same = (now.st_dev, now.st_ino) == (hashed.st_dev, hashed.st_ino)
        return Taken(digest, size, blocks, hashed if same else None)

    def has(self, digest: str) -> bool:
        return _fs.regular_file(self._object_path(digest)) is not None

    def size(self, digest: str) -> int:
        return self._stat(digest).st_size

    def path(self, digest: str) -> Path:
        """The path of an existing object, for readers that open it themselves (no-follow)."""
        self._stat(digest)
        return self._object_path(digest)

    def read_bytes(self, digest: str, *, verify: bool = True) -> bytes:
        """A whole (small) object, rehashed unless verify=False."""
        fd = _fs.open_read(self.path(digest))
        try:
            with os.fdopen(fd, "rb", closefd=False) as handle:
                data = handle.read()
        finally:
            os.close(fd)
        if verify and DIGEST_PREFIX + hashlib.sha256(data).hexdigest() != digest:
            raise IntegrityError(f"object {digest} does not hash to its name")
        return data

    def objects(self) -> Iterator[str]:
        base = self.root / "objects" / "sha256"
        for shard in sorted(os.listdir(base)):
            shard_path = base / shard
            _fs.refuse_symlink(shard_path)
            if not _is_shard(shard) or not stat.S_ISDIR(os.lstat(shard_path).st_mode):
                continue  # a stray: verify reports it
            for rest in sorted(os.listdir(shard_path)):
                name = shard + rest
                if len(name) == 64 and set(name) <= _HEX:
                    yield DIGEST_PREFIX + name

    def verify_object(self, digest: str) -> None:
        """Rehashes one object; IntegrityError when its bytes no longer match its name."""
        fd = _fs.open_read(self.path(digest))
        try:
            found = sha256_fd(fd)
        finally:
            os.close(fd)
        if found != digest:
            raise IntegrityError(f"object {digest} is corrupt: its bytes hash to {found}")

    def verify(self, digests: Iterable[str] | None = None, *, threads: int = 4) -> VerifyReport:
        """Rehashes the given objects (all when None); symlinks and strays count as bad."""
        bad: list[tuple[str, str]] = []
        if digests is None:
            bad += self._strays()
            bad += self._layout_problems()
            digests = list(self.objects())
        todo = list(digests)

        def one(digest: str) -> tuple[str, str] | None:
            try:
                self.verify_object(digest)
            except StoreError as exc:
                return (digest, str(exc))
            return None

        with ThreadPoolExecutor(max(1, threads)) as pool:
            bad += [r for r in pool.map(one, todo) if r is not None]
        return VerifyReport(checked=len(todo), bad=tuple(bad))

    # capsules -----------------------------------------------------------------------------

    def publish(self, capsule: Capsule, *, tag: str | None = None) -> str:
        """Makes a capsule visible in one atomic step, after checking that every member is in
        the store with its recorded size. Returns the digest of the capsule's manifest."""
        if tag is not None and (problem := tag_problem(tag)):
            raise StoreError(f"tag: {problem}")
        with self._store_lock():
            problems = []
            for member in capsule.members:
                st = _fs.regular_file(self._object_path(member.digest))
                if st is None:
                    problems.append(f"member {member.name!r}: object {member.digest} is missing")
                elif st.st_size != member.size:
                    problems.append(
                        f"member {member.name!r}: size is {st.st_size}, the manifest says "
                        f"{member.size}"
                    )
            if problems:
                raise StoreError("cannot publish the capsule:\n  " + "\n  ".join(problems))
            digest = self.put_bytes(to_json(capsule))
            self._put_file(self._marker(digest), b"")
            if tag is not None:
                self._write_tag(tag, digest)
        return digest

    def capsules(self) -> list[str]:
        """Digests of the published capsules."""
        found = []
        for name in sorted(os.listdir(self.root / "capsules")):
            if len(name) == 64 and set(name) <= _HEX:
                _fs.regular_file(self.root / "capsules" / name)
                found.append(DIGEST_PREFIX + name)
        return found

    def capsule(self, ref: str) -> Capsule:
        """A published capsule by tag or digest; its manifest is rehashed before parsing."""
        digest = self.resolve(ref)
        return from_json(self.read_bytes(digest), Capsule)

    def resolve(self, ref: str) -> str:
        """The digest of a published capsule, given a tag (`tiny-llama`) or a digest."""
        if ref.startswith(DIGEST_PREFIX):
            if problem := digest_problem(ref):
                raise StoreError(problem)
            digest = ref
        else:
            if problem := tag_problem(ref):
                raise StoreError(problem)
            digest = self._read_tag(ref).capsule
        if _fs.regular_file(self._marker(digest)) is None:
            raise NoCapsule(
                f"no published capsule {digest}" + ("" if ref == digest else f" ({ref})")
            )
        return digest

    def lookup(self, ref: str) -> str:
        """`resolve`, and short digests as `ls` prints them: a tag that exists wins; otherwise
        4 to 63 hex digits (with or without `sha256:`) name the one published capsule whose
        digest begins with them. NoCapsule when none does or several do (naming them), or
        when no tag has the name (listing the tags)."""
        prefix = short_digest(ref)
        if prefix is None or (not ref.startswith(DIGEST_PREFIX) and self._has_tag(ref)):
            if prefix is None and tag_problem(ref) is None and not self._has_tag(ref):
                raise NoCapsule(f"no tag {ref!r} in {self.root}{self._tags_hint()}")
            return self.resolve(ref)
        found = [d for d in self.capsules() if d.removeprefix(DIGEST_PREFIX).startswith(prefix)]
        if len(found) == 1:
            return found[0]
        if found:
            raise NoCapsule(
                f"{ref!r} is ambiguous: the digests of {len(found)} capsules begin with it ("
                + ", ".join(found)
                + "): give more digits"
            )
        raise NoCapsule(
            f"no tag {ref!r} and no capsule whose digest begins with {prefix} in {self.root}"
            + self._tags_hint()
        )

    def _tags_hint(self) -> str:
        tags = self.tag_names()
        return f" (tags: {', '.join(tags)})" if tags else " (it holds no tags)"

    def _has_tag(self, name: str) -> bool:
        return tag_problem(name) is None and _fs.regular_file(self.root / "tags" / name) is not None

    def tag(self, tag: str, ref: str) -> str:
        """Points `tag` at a published capsule (replacing what it pointed at)."""
        if problem := tag_problem(tag):
            raise StoreError(f"tag: {problem}")
        with self._store_lock():
            digest = self.resolve(ref)
            self._write_tag(tag, digest)
        return digest

    def untag(self, tag: str) -> None:
        if problem := tag_problem(tag):
            raise StoreError(f"tag: {problem}")
        with self._store_lock():
            path = self.root / "tags" / tag
            if _fs.regular_file(path) is None:
                raise StoreError(f"no tag {tag!r}")
            path.unlink()

    def tag_names(self) -> list[str]:
        """The names in tags/, without reading the records (one may be damaged)."""
        return [n for n in sorted(os.listdir(self.root / "tags")) if tag_problem(n) is None]

    def tags(self) -> dict[str, str]:
        return {name: self._read_tag(name).capsule for name in self.tag_names()}

    def unpublish(self, ref: str) -> str:
        """Hides a capsule (and drops the tags naming it); its objects go at the next gc."""
        with self._store_lock():
            digest = self.resolve(ref)
            self._unpublish(digest)
        return digest

    def _unpublish(self, digest: str) -> tuple[str, ...]:
        """With the store lock held: drops the capsule's tags and marker; the tags dropped."""
        tags = tuple(tag for tag, target in self.tags().items() if target == digest)
        for tag in tags:
            (self.root / "tags" / tag).unlink()
        self._marker(digest).unlink()
        _atomic.fsync_dir(self.root / "capsules")
        return tags

    def remove(self, ref: str) -> Removed:
        """Unpublishes a capsule (and the tags naming it), then frees at once the objects only
        it reached that nothing wrote again since it was published. An object written again
        since may be a capture's in progress (taking an object already there refreshes its
        age), so it is left for gc's grace, as are objects another capsule names; with any
        other capsule unreadable nothing is freed (what it names is not known)."""
        with self._store_lock():
            digest = self.resolve(ref)
            published = os.lstat(self._marker(digest)).st_mtime
            tags = self._unpublish(digest)
            try:
                manifest = from_json(self.read_bytes(digest), Capsule)
                others = self._reachable()
            except (StoreError, RecordError) as exc:
                return Removed(digest=digest, tags=tags, freed=(), freed_bytes=0, unread=str(exc))
            mine = {digest, *(m.digest for m in manifest.members)}
            freed, freed_bytes, shared, touched = [], 0, Tally(), Tally()
            for obj in sorted(mine):
                with self._object_lock(obj):
                    st = _fs.regular_file(self._object_path(obj))
                    if st is None:
                        continue
                    if obj in others:
                        shared = shared.add(st.st_size)
                    elif st.st_mtime > published:
                        touched = touched.add(st.st_size)
                    else:
                        self._object_path(obj).unlink()
                        freed.append(obj)
                        freed_bytes += st.st_size
        return Removed(
            digest=digest, tags=tags, freed=tuple(freed), freed_bytes=freed_bytes,
            shared=shared, touched=touched,
        )  # fmt: skip

    def _reachable(self) -> set[str]:
        """Every object a published capsule names (its manifest and members)."""
        reachable: set[str] = set()
        for digest in self.capsules():
            manifest = from_json(self.read_bytes(digest), Capsule)
            reachable.add(digest)
            reachable.update(m.digest for m in manifest.members)
        return reachable

    def gc(
        self,
        *,
        grace_s: float = 3600.0,
        untagged: bool = False,
        in_use: Iterable[str] = (),
    ) -> GcReport:
        """Removes objects no published capsule reaches, and stale temporary files (only files in
        tmp/ named as the store names its own: nothing else is the store's). Objects and
        temporaries younger than `grace_s` are kept: they may belong to a capture that has not
        published yet. With `untagged`, a capsule no tag names (a re-captured tag's earlier
        capsule) is unpublished first once it was published longer than `grace_s` ago, unless
        `in_use` names it (a restore serves it). Fails closed (removes nothing) if a published
        manifest is unreadable or a symlink is found."""
        with self._store_lock():
            strays = self._strays()
            if strays:
                raise StoreError(
                    "gc refused: " + "; ".join(f"{where}: {why}" for where, why in strays)
                )
            for digest in self.capsules():
                try:
                    from_json(self.read_bytes(digest), Capsule)
                except (StoreError, RecordError) as exc:
                    raise StoreError(f"gc refused: capsule {digest} is unreadable: {exc}") from exc
            for tag, target in self.tags().items():
                if _fs.regular_file(self._marker(target)) is None:
                    (self.root / "tags" / tag).unlink()
            horizon = time.time() - grace_s
            unpublished, young_capsules, in_use_capsules = [], [], []
            if untagged:
                using, tagged = set(in_use), set(self.tags().values())
                for digest in self.capsules():
                    if digest in tagged:
                        continue
                    if digest in using:
                        in_use_capsules.append(digest)
                    elif os.lstat(self._marker(digest)).st_mtime > horizon:
                        young_capsules.append(digest)
                    else:
                        self._marker(digest).unlink()
                        unpublished.append(digest)
                if unpublished:
                    _atomic.fsync_dir(self.root / "capsules")
            reachable = self._reachable()
            removed, freed, reached, young = [], 0, Tally(), Tally()
            for digest in list(self.objects()):
                with self._object_lock(digest):
                    path = self._object_path(digest)
                    st = _fs.regular_file(path)
                    if st is None:
                        continue
                    if digest in reachable:
                        reached = reached.add(st.st_size)
                        continue
                    if st.st_mtime > horizon:
                        young = young.add(st.st_size)
                        continue
                    path.unlink()
                    removed.append(digest)
                    freed += st.st_size
            for entry in os.scandir(self.root / "tmp"):
                if not _TEMPORARY.fullmatch(entry.name) or not entry.is_file(follow_symlinks=False):
                    continue  # not a file the store wrote: not the store's to remove
                if entry.stat(follow_symlinks=False).st_mtime <= horizon:
                    os.unlink(entry.path)
        return GcReport(
            removed=tuple(removed), freed_bytes=freed, kept=reached.count + young.count,
            reached=reached, young=young, unpublished=tuple(unpublished),
            young_capsules=tuple(young_capsules), in_use_capsules=tuple(in_use_capsules),
        )  # fmt: skip

    # internals ----------------------------------------------------------------------------

    def _object_path(self, digest: str) -> Path:
        if problem := digest_problem(digest):
            raise StoreError(problem)
        hexdigest = digest.removeprefix(DIGEST_PREFIX)
        return self.root / "objects" / "sha256" / hexdigest[:2] / hexdigest[2:]

    def _marker(self, digest: str) -> Path:
        if problem := digest_problem(digest):
            raise StoreError(problem)
        return self.root / "capsules" / digest.removeprefix(DIGEST_PREFIX)

    def _stat(self, digest: str) -> os.stat_result:
        path = self._object_path(digest)
        _fs.refuse_symlink(path.parent)
        st = _fs.regular_file(path)
        if st is None:
            raise StoreError(f"no object {digest} in {self.root}")
        return st

    def _install(self, tmp: Path, digest: str) -> None:
        """Renames a complete, fsynced temporary file to its object path; if the object is
        already there (another writer won), keeps that one and refreshes its age for gc."""
        path = self._object_path(digest)
        with self._object_lock(digest):
            _fs.private_dir(path.parent)
            st = _fs.regular_file(path)
            if st is not None:
                os.utime(path, follow_symlinks=False)
                tmp.unlink()
                return
            _atomic.durable_replace(tmp, path)

    def _object_lock(self, digest: str) -> FileLock:
        shard = digest.removeprefix(DIGEST_PREFIX)[:2]
        return FileLock(self.root / "locks" / f"objects-{shard}.lock", mode=_fs.FILE_MODE)

    def _store_lock(self) -> FileLock:
        return FileLock(self.root / "locks" / "store.lock", mode=_fs.FILE_MODE)

    def _write_tag(self, tag: str, digest: str) -> None:
        self._put_file(self.root / "tags" / tag, to_json(TagRecord(tag=tag, capsule=digest)))

    def _temporary(self, install: Callable[[Path, str], None]) -> ObjectWriter:
        """A writer whose temporary file is in tmp/, where gc finds what a crash left behind."""
        return ObjectWriter(self.root / "tmp" / f"{uuid.uuid4().hex}.part", install)

    def _put_file(self, final: Path, data: bytes) -> None:
        """A small store file (a tag, a capsule marker), written whole, then renamed into place."""
        with self._temporary(lambda tmp, _: _atomic.durable_replace(tmp, final)) as writer:
            writer.write(data)
            writer.commit()

    def _read_tag(self, tag: str) -> TagRecord:
        path = self.root / "tags" / tag
        if _fs.regular_file(path) is None:
            raise NoCapsule(f"no tag {tag!r} in {self.root}")
        fd = _fs.open_read(path)
        try:
            with os.fdopen(fd, "rb", closefd=False) as handle:
                record = from_json(handle.read(), TagRecord)
        finally:
            os.close(fd)
        if record.tag != tag:
            raise StoreError(f"tag file {tag!r} names {record.tag!r}")
        return record

    def _layout_problems(self) -> list[tuple[str, str]]:
        """What a whole-store verify checks besides the objects' bytes: every entry of a shard
        is an object name; every published capsule's manifest and members are present, with
        their recorded sizes; every tag file is a tag record naming a published capsule."""
        found: list[tuple[str, str]] = []
        base = self.root / "objects" / "sha256"
        for shard in sorted(os.listdir(base)):
            if not _is_shard(shard) or not stat.S_ISDIR(os.lstat(base / shard).st_mode):
                found.append((str(base / shard), "not an object shard (a directory, 2 hex)"))
                continue
            for rest in sorted(os.listdir(base / shard)):
                if len(rest) != 62 or not set(rest) <= _HEX:
                    found.append((str(base / shard / rest), "not an object (62 hex digits)"))
        for name in sorted(os.listdir(self.root / "capsules")):
            if len(name) != 64 or not set(name) <= _HEX:
                found.append((str(self.root / "capsules" / name), "not a capsule marker"))
        for digest in self.capsules():
            if not self.has(digest):
                found.append((digest, "the capsule's manifest object is missing"))
                continue
            try:
                capsule = from_json(self.read_bytes(digest), Capsule)
            except (StoreError, RecordError) as exc:
                found.append((digest, f"the capsule's manifest is unreadable: {exc}"))
                continue
            for member in capsule.members:
                st = _fs.regular_file(self._object_path(member.digest))
                if st is None:
                    found.append(
                        (digest, f"member {member.name!r}: object {member.digest} is missing")
                    )
                elif st.st_size != member.size:
                    found.append(
                        (
                            digest,
                            f"member {member.name!r}: {st.st_size} bytes, the manifest says "
                            f"{member.size}",
                        )
                    )
        for name in sorted(os.listdir(self.root / "tags")):
            path = str(self.root / "tags" / name)
            if tag_problem(name) is not None:
                found.append((path, f"tag {name!r}: not a tag name"))
                continue
            try:
                self.resolve(self._read_tag(name).capsule)
            except (StoreError, RecordError) as exc:
                found.append((path, f"tag {name!r}: {exc}"))
        return found

    def _strays(self) -> list[tuple[str, str]]:
        """Symlinks and non-regular entries anywhere in the store."""
        found = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                mode = os.lstat(path).st_mode
                if stat.S_ISLNK(mode):
                    found.append((path, "symlink (the store refuses symlinks)"))
                elif not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                    found.append((path, "not a regular file or directory"))
        return found


def _is_shard(name: str) -> bool:
    return len(name) == 2 and set(name) <= _HEX


def _now(fn: Callable[..., object], *args: object) -> Future[object]:
    """Runs `fn` here and now, as a finished future (`take` without helpers)."""
    done: Future[object] = Future()
    try:
        done.set_result(fn(*args))
    except BaseException as exc:
        done.set_exception(exc)
    return done


def _copy_in(source: Path, tmp: Path) -> None:
    """Copies `source` into a new private file `tmp` in the kernel (its bytes never pass
    through Python: a user-space copy writes a few times slower on our hosts)."""
    src = _fs.open_read(source)
    try:
        dst = _fs.create_exclusive(tmp)
        try:
            try:
                offset = 0
                while n := os.sendfile(dst, src, offset, _SENDFILE_BYTES):
                    offset += n
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                _copy_through_buffer(src, dst)  # a filesystem that refuses sendfile
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy_through_buffer(src: int, dst: int) -> None:
    os.ftruncate(dst, 0)
    os.lseek(dst, 0, os.SEEK_SET)
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    offset = 0
    while n := os.preadv(src, [buffer], offset):
        _fs.write_all(dst, view[:n])
        offset += n


def _one_pass(
    name: Path,
    src: int,
    block_bytes: int | None,
    run: Callable[..., Future[object]],
    progress: Callable[[int], None] | None,
) -> tuple[str, int, tuple[str, ...]]:
    """Reads `src` once, in pieces of one block (or CHUNK), into two buffers used in turn:
    the whole-file sha256 is updated here while `run` hashes the previous block. A buffer is
    read into again only when what hashed it is done. Returns the digest, the bytes read and
    each block's sha256 (hex); StoreError names `name` if the file grew while it was read."""
    whole = hashlib.sha256()
    size = os.fstat(src).st_size
    piece = block_bytes or CHUNK
    # a file smaller than a piece is read whole (one byte to spare shows that it ended)
    buffers = [bytearray(piece if size >= piece else size + 1) for _ in range(2)]
    busy: list[list[Future[object]]] = [[], []]
    blocks: list[Future[object]] = []
    offset, turn = 0, 0
    try:
        while True:
            for job in busy[turn]:
                job.result()
            busy[turn] = []
            view = memoryview(buffers[turn])
            n = _read_full(src, view, offset)
            if n == 0:
                break
            if n == len(view) < piece:
                raise StoreError(f"{name} grew from {size} bytes while it was read")
            data = view[:n]
            if block_bytes is not None:
                blocks.append(run(_sha256_hex, data))
                busy[turn].append(blocks[-1])
            whole.update(data)
            if progress is not None:
                progress(n)
            offset += n
            if n < len(view):
                break  # a short read is the end of the file
            turn ^= 1
    finally:
        for jobs in busy:
            for job in jobs:
                job.exception()  # nothing may still use a buffer when it is freed
    for jobs in busy:
        for job in jobs:
            job.result()
    return DIGEST_PREFIX + whole.hexdigest(), offset, tuple(str(b.result()) for b in blocks)


def _read_full(fd: int, view: memoryview, offset: int) -> int:
    """Fills `view` from `offset` unless the file ends first; the bytes read."""
    done = 0
    while done < len(view) and (n := os.preadv(fd, [view[done:]], offset + done)):
        done += n
    return done


def _sha256_hex(data: memoryview) -> str:
    return hashlib.sha256(data).hexdigest()
