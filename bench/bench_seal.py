"""Sealing a capture's capsule: the product's `seal` step against what the host can read and hash,
and against the seal as it was before (one file after another, then a second pass for the image's
blocks), side by side in one run.

A synthetic capture shaped like the H200's (a 5.0 GB CRIU image of a few large
pages-*.img files and many small ones, an 8.5 GB native payload of one pack and its index; here
scaled to `--gib`) is written fresh before every repetition, so it is in the page cache and dirty,
as CRIU and the exporter leave it. Each repetition then seals it one of these ways, interleaved:

  seal        StoreArtifacts.seal on a step context (the product's code path: Store.take, many
              files at once, each byte read once for its name and its blocks, fsync overlapped,
              the model's checkpoint hashed beside)
  previous    what seal did before: Store.adopt (or put_file) one file after another, then the
              image's blocks hashed in a second pass on many threads, then the checkpoint
              (the store work only: the identity's platform is collected once before timing,
              and the bench's engine build costs nothing)

and the same bytes are measured for baselines:

  read        one thread reading every file (`cat`-like, page cache)
  sha256      one thread, one sha256 pass over every file (what a name costs, in turn)
  ideal       one sha256 pass per file, files on many threads (the largest file bounds it)
  fsync       fsync of every file of a freshly written tree, on many threads (the disk's part)
  copy        (with --payload-dir on another filesystem) the payload copied onto the store's
              filesystem and fsynced, no hashing: what a copy alone costs

After `--warmup` uncounted repetitions (each way goes first by turns), it prints the median
seconds and GiB/s of each, and the ratios: seal against previous, and seal against each
baseline (a ratio of 1.0 to `ideal` is what the host can hash).

    .venv/bin/python bench/bench_seal.py [--gib 1.5] [--reps 3] [--dir /var/tmp]
        [--payload-dir /dev/shm]   # a payload on another filesystem than the store: copied in
        [--model-gib 0]            # a checkpoint file of this size, hashed by every seal
        [--image-share 0.37] [--large 3] [--small 200] [--threads N] [--warmup 1]
        [--json OUT.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from coldsnap.artifacts import BLOCK_BYTES, Member, Store, checkpoint_digests, collect_platform
from coldsnap.capsules import _steps
from coldsnap.machine import InstalledBuild
from coldsnap.machine import steps as s

GIB = 1 << 30
_CHUNK = 8 << 20
_PATTERN = os.urandom(64 << 20)  # written again and again; a per-file header keeps files apart


class _Ctx:
    """What the seal step sees of StepContext."""

    def __init__(self, request: Any, workdir: Path, facts: dict[str, Any]) -> None:
        self.request, self.workdir, self.facts = request, workdir, facts
        self.step = s.SEAL
        self.spec = SimpleNamespace(makes=lambda: (s.IMAGE_DIR, *s.SEAL.makes))

    def record(self, **facts: Any) -> None:
        self.facts.update(facts)

    def advance(self, what: str, done: int, total: int, started: float) -> None:
        return None

    def check(self) -> None:
        return None


class _Engine:
    name = "bench"
    capabilities: frozenset[str] = frozenset()

    def build(self) -> InstalledBuild:
        digest = "sha256:" + "00" * 32
        return InstalledBuild(engine="bench", version="1", contract=digest, plugin_digest=digest)


def _write(path: Path, size: int, tag: str, fsync: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = hashlib.sha256(tag.encode()).digest()
    with open(path, "wb", buffering=0) as f:
        f.write(head[: min(size, len(head))])
        left = size - min(size, len(head))
        while left:
            n = f.write(memoryview(_PATTERN)[: min(left, len(_PATTERN))])
            left -= n
        if fsync:
            os.fsync(f.fileno())


def shape(args: argparse.Namespace) -> dict[str, dict[str, int]]:
    """Image and payload files with their sizes: the large pages files share the image 60/30/10
    (one process holds most), the small ones 4-64 KiB; one pack plus a small index."""
    total = int(args.gib * GIB)
    image_bytes = int(total * args.image_share)
    small = {f"small-{i}.img": 4096 << (i % 5) for i in range(args.small)}
    left = max(0, image_bytes - sum(small.values()))
    shares = [0.6, 0.3, 0.1][: args.large] if args.large <= 3 else [1 / args.large] * args.large
    shares = [x / sum(shares) for x in shares]
    image = {f"pages-{i + 1}.img": int(left * x) for i, x in enumerate(shares)} | small
    payload = {"tp0/weights/index.json": 64 << 10, "tp0/weights/pack-0.pack": total - image_bytes}
    return {"image": image, "payload": payload}


def lay_out(root: Path, payload_root: Path, files: dict[str, dict[str, int]], tag: str) -> None:
    for name, size in files["image"].items():
        _write(root / "image" / name, size, f"{tag}/image/{name}")
    for name, size in files["payload"].items():
        # the exporter fsyncs its pack (coldsnap.providers.native._export); CRIU does not
        _write(payload_root / "payload" / name, size, f"{tag}/payload/{name}", fsync=True)


def _files(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*") if p.is_file())


def seal_now(root: Path, payload_root: Path, store: Path, model: Path) -> float:
    request = SimpleNamespace(
        driver="n610", provider="native", engine="bench", name="bench", tp=1, store=str(store),
        model=SimpleNamespace(id="org/bench", revision="r", path=str(model)), engine_args=(),
    )  # fmt: skip
    facts = {
        s.IMAGE_DIR.name: str(root / "image"),
        s.PAYLOAD_DIR.name: str(payload_root / "payload"),
    }
    t0 = time.perf_counter()
    _steps.StoreArtifacts(_Engine(), verified=None).seal(_Ctx(request, root, facts))
    return time.perf_counter() - t0


def seal_previous(root: Path, payload_root: Path, store_path: Path, model: Path) -> float:
    """The seal's store work as it was before this change (adopt in turn, then a block pass)."""
    t0 = time.perf_counter()
    store = Store(store_path)
    device = os.stat(store.root).st_dev
    members = []
    for tree, role in ((root / "image", "process-image"), (payload_root / "payload", "payload")):
        for path in _files(tree):
            st = path.stat()
            digest = store.adopt(path) if st.st_dev == device else store.put_file(path)
            members.append(Member(role, f"x/{path.name}", digest, st.st_size))
    image = [m for m in members if m.role == "process-image"]
    tasks = [(m, b) for m in image for b in range(-(-m.size // BLOCK_BYTES))]
    with ThreadPoolExecutor(_steps._threads(len(tasks))) as pool:
        list(pool.map(lambda t: _steps._hash_block(store.path(t[0].digest), t[1]), tasks))
    checkpoint_digests(model)
    return time.perf_counter() - t0


def _read(path: Path, sha: Any | None = None) -> None:
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            if sha is not None:
                sha.update(view[:n])


def read_all(paths: list[Path]) -> float:
    t0 = time.perf_counter()
    for p in paths:
        _read(p)
    return time.perf_counter() - t0


def sha_all(paths: list[Path]) -> float:
    t0 = time.perf_counter()
    for p in paths:
        _read(p, hashlib.sha256())
    return time.perf_counter() - t0


def sha_parallel(paths: list[Path], threads: int) -> float:
    ordered = sorted(paths, key=lambda p: -p.stat().st_size)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda p: _read(p, hashlib.sha256()), ordered))
    return time.perf_counter() - t0


def fsync_all(paths: list[Path], threads: int) -> float:
    def one(p: Path) -> None:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, paths))
    return time.perf_counter() - t0


def copy_payload(payload: Path, dest: Path) -> float:
    t0 = time.perf_counter()
    for path in _files(payload):
        target = dest / path.name
        shutil.copyfile(path, target)
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return time.perf_counter() - t0


def _fs(path: Path) -> str:
    """The filesystem type and device of `path`, from /proc/mounts (longest mount prefix)."""
    best = ("?", "?", "")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mount, kind = line.split()[:3]
            if str(path.resolve()).startswith(mount) and len(mount) > len(best[2]):
                best = (kind, dev, mount)
    except OSError:
        pass
    return f"{best[0]} ({best[1]} on {best[2]})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.5, help="image + payload (default 1.5)")
    ap.add_argument("--image-share", type=float, default=0.37, help="5.0 of 13.5 GB on the H200")
    ap.add_argument("--large", type=int, default=3, help="large pages-*.img files")
    ap.add_argument("--small", type=int, default=200, help="small image files (4-64 KiB)")
    ap.add_argument("--model-gib", type=float, default=0.0, help="checkpoint file to hash")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="repetitions not counted")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="tree and store")
    ap.add_argument("--payload-dir", type=Path, default=None, help="payload elsewhere")
    ap.add_argument("--threads", type=int, default=None, help="seal threads (VERIFY_THREADS)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        _steps.VERIFY_THREADS = args.threads
    threads = _steps.VERIFY_THREADS
    files = shape(args)
    total = sum(sum(v.values()) for v in files.values())
    base = Path(tempfile.mkdtemp(prefix="coldsnap-bench-seal-", dir=args.dir))
    payload_base = (
        Path(tempfile.mkdtemp(prefix="coldsnap-bench-seal-", dir=args.payload_dir))
        if args.payload_dir
        else base
    )
    model = base / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    _write(model / "model.safetensors", int(args.model_gib * GIB), "model", fsync=True)
    print(
        f"{total / GIB:.2f} GiB: image {sum(files['image'].values()) / GIB:.2f} GiB in "
        f"{len(files['image'])} files, payload {sum(files['payload'].values()) / GIB:.2f} GiB; "
        f"model {args.model_gib} GiB; {os.cpu_count()} cores, {threads} threads; BLOCK_BYTES "
        f"{BLOCK_BYTES >> 20} MiB\nstore and image on {_fs(base)}, payload on "
        f"{_fs(payload_base)}",
        flush=True,
    )
    collect_platform()  # a first call imports torch: taken before any way is timed
    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}  # CPU seconds of this process (all threads) per way
    ways: dict[str, Callable[[Path, Path, Path], float]] = {
        "seal": lambda r, p, st: seal_now(r, p, st, model),
        "previous": lambda r, p, st: seal_previous(r, p, st, model),
    }
    try:
        for rep in range(-args.warmup, args.reps):
            order = list(ways.items())[:: 1 if rep % 2 == 0 else -1]  # each way goes first by turns
            for way, run in order:
                root, proot = base / f"{way}-{rep}", payload_base / f"{way}-{rep}"
                lay_out(root, proot, files, f"{way}-{rep}")
                cpu0 = os.times()
                took = run(root, proot, base / f"store-{way}-{rep}")
                cpu1 = os.times()
                if rep >= 0:
                    times.setdefault(way, []).append(took)
                    busy = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
                    cpu.setdefault(way, []).append(busy)
                shutil.rmtree(root)
                shutil.rmtree(base / f"store-{way}-{rep}")
                if proot != root:
                    shutil.rmtree(proot, ignore_errors=True)
            if rep < 0:
                print(f"warm-up {rep + args.warmup + 1} of {args.warmup} done", flush=True)
                continue
            root, proot = base / f"base-{rep}", payload_base / f"base-{rep}"
            lay_out(root, proot, files, f"base-{rep}")
            paths = _files(root / "image", proot / "payload") + _files(model)
            times.setdefault("fsync", []).append(fsync_all(paths, threads))
            times.setdefault("read", []).append(read_all(paths))
            times.setdefault("sha256", []).append(sha_all(paths))
            times.setdefault("ideal", []).append(sha_parallel(paths, threads))
            if proot != root:
                (base / "copy").mkdir()
                times.setdefault("copy", []).append(copy_payload(proot / "payload", base / "copy"))
                shutil.rmtree(base / "copy")
            shutil.rmtree(root)
            if proot != root:
                shutil.rmtree(proot, ignore_errors=True)
            print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
                  flush=True)  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if payload_base != base:
            shutil.rmtree(payload_base, ignore_errors=True)
    hashed = total + int(args.model_gib * GIB)
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{'way':<9} {'median s':>9} {'GiB/s':>7}  {'seal is':>8}")
    for way, sec in median.items():
        ratio = sec / median["seal"]
        print(f"{way:<9} {sec:>9.3f} {hashed / GIB / sec:>7.2f}  {ratio:>7.2f}x")
    for way, spent in cpu.items():
        print(f"{way}: {statistics.median(spent):.3f} CPU s (median; all threads, user + system)")
    print(
        f"\nseal {median['previous'] / median['seal']:.2f}x faster than previous; "
        f"seal reaches {median['ideal'] / median['seal']:.2f} of ideal (parallel sha256), "
        f"{median['sha256'] / median['seal']:.2f}x one sha256 pass, "
        f"{median['read'] / median['seal']:.2f} of a one-thread read"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "bytes": hashed,
                    "times": times,
                    "cpu": cpu,
                    "median": median,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
