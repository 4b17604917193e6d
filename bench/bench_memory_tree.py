"""What an n610 image of a CPU SGLang server is made of: the anonymous memory of each process of a
cold server's tree, by kind of mapping, and what glibc's malloc_trim(0) gives back on top.

    .venv/bin/python bench/bench_memory_tree.py [--size tiny] [--trim]

CRIU dumps a process's private pages (heap, anonymous mappings, written data of libraries), so
the sum printed here is, within a few percent, the image an n610 capture of this tree writes
(weights released: the printed weights are subtracted by the capture, not here). --trim calls
malloc_trim(0) in every process through gdb and prints the sums again: the glibc heap's free
memory the trim returns is what an in-process trim at release could save.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _common import load, tiny_llama, work_dir

from coldsnap.backends.procs import tree_pids
from coldsnap.cli._demo import start_plain_server, wait_first_answer

MIB = 1 << 20


def anonymous(pid: int) -> tuple[collections.Counter[str], list[tuple[int, str, str]]]:
    """Anonymous bytes of one process by mapping kind, and its largest mappings."""
    kinds: collections.Counter[str] = collections.Counter()
    large: list[tuple[int, str, str]] = []
    where = ("", "")
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        parts = line.split()
        if not parts[0].endswith(":"):
            where = (parts[0], parts[5] if len(parts) > 5 else "[anon]")
        elif parts[0] == "Anonymous:":
            nbytes = int(parts[1]) * 1024
            path = where[1]
            kind = "libraries' data" if ".so" in path else path
            kinds[kind if not kind.startswith("/") else "other files"] += nbytes
            if nbytes >= 16 * MIB:
                large.append((nbytes, where[0], path))
    return kinds, sorted(large, reverse=True)[:6]


def show(pids: list[int], *, detail: bool) -> int:
    total = 0
    for pid in pids:
        try:
            kinds, large = anonymous(pid)
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        total += sum(kinds.values())
        parts = ", ".join(f"{k} {v / MIB:.0f}" for k, v in kinds.most_common(4) if v >= MIB)
        print(f"  pid {pid} {name}: {sum(kinds.values()) / MIB:.0f} MiB anonymous ({parts})")
        for nbytes, span, path in large if detail else []:
            print(f"      {nbytes / MIB:5.0f} MiB {span} {path}")
    print(f"  tree: {total / MIB:.0f} MiB anonymous")
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=("tiny", "small"))
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) in each process")
    args = parser.parse_args()
    with work_dir("bench_memory_tree") as root:
        info, _ = tiny_llama(root, args.size)
        print(f"model: llama {args.size}, {info.weight_bytes / 1e6:.1f} MB of weights")
        server = start_plain_server(info.path, root / "server.log")
        try:
            wait_first_answer(server)
            time.sleep(2)
            pids = tree_pids(server.launched.pid)
            before = show(pids, detail=True)
            if args.trim and shutil.which("gdb"):
                for pid in pids:
                    subprocess.run(
                        ["gdb", "-p", str(pid), "-batch", "-ex", "call (int)malloc_trim(0)"],
                        capture_output=True,
                        timeout=120,
                        check=False,
                    )
                print("after malloc_trim(0) in every process:")
                after = show(pids, detail=False)
                print(f"  returned {(before - after) / MIB:.0f} MiB")
        finally:
            server.stop()
    print(f"load average {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
