"""Measures CRIU dump and restore of a Python process holding 200 MB (not a test: a figure).

    .venv/bin/python -m tests.backends.measure_criu [--runs 5] [--mb 200] [--dir /tmp]

Cycle: launch, then N times: dump (the tree is killed) into a fresh directory, restore it,
check the checksum. Prints each time and the medians. Needs root and CRIU >= 4.2.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from coldsnap.backends import Criu, become_subreaper, launch, stop_tree, wait_gone

from .conftest import ask, target, wait_for_line

REPORT = r"report pid=(\d+) count=(\d+) checksum=(\d+)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    opts = parser.parse_args()
    become_subreaper()
    criu = Criu()
    problem = criu.problem()
    if problem:
        raise SystemExit(problem)
    base = Path(tempfile.mkdtemp(prefix="coldsnap-measure-", dir=opts.dir))
    log = base / "counter.log"
    proc = launch(target("counter.py", opts.mb), log_path=log)
    checksum = int(wait_for_line(log, r"ready pid=\d+ checksum=(\d+)", timeout=120)[1])
    pid, dumps, restores, walls, sizes = proc.pid, [], [], [], []
    try:
        for run in range(opts.runs):
            images = base / f"image-{run}"
            t0 = time.perf_counter()
            manifest = criu.dump(pid, images)
            walls.append(time.perf_counter() - t0)
            dumps.append(manifest.seconds)
            sizes.append(manifest.image_bytes)
            wait_gone(pid, timeout=10)
            if run == 0:
                proc.wait(10)
            tree = criu.restore(images)
            restores.append(tree.seconds)
            got = int(ask(tree.pid, log, REPORT)[3])
            assert got == checksum, f"checksum {got} != {checksum}"
            pid = tree.pid
            print(
                f"run {run}: dump {manifest.seconds:.3f} s (call {walls[-1]:.3f} s), "
                f"image {manifest.image_bytes / 2**20:.0f} MiB, restore {tree.seconds:.3f} s",
                flush=True,
            )
            if run:
                shutil.rmtree(base / f"image-{run - 1}")
    finally:
        stop_tree(pid, timeout=5)
    print(
        f"{opts.mb} MB process, {opts.runs} runs, images in {opts.dir}: "
        f"dump median {statistics.median(dumps):.3f} s (min {min(dumps):.3f}, "
        f"max {max(dumps):.3f}); restore median {statistics.median(restores):.3f} s "
        f"(min {min(restores):.3f}, max {max(restores):.3f}); "
        f"image {statistics.median(sizes) / 2**20:.0f} MiB"
    )
    shutil.rmtree(base)


if __name__ == "__main__":
    main()
