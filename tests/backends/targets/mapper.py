"""Maps each file named on the command line (shared) and holds a multiprocessing lock, as
SGLang does: with the spawn context the named semaphore stays linked while the process maps
the deleted temporary name glibc made it under, which CRIU must dump with --link-remap.
The resource tracker it starts makes the tree two processes. SIGUSR1 prints each mapping.
With --no-lock first, a plain fork-context lock: one process, nothing left in /dev/shm."""

import mmap
import multiprocessing
import os
import signal
import sys
import time

args = sys.argv[1:]
with_lock = args[:1] != ["--no-lock"]
maps = []
for path in args[0 if with_lock else 1 :]:
    with open(path, "r+b") as f:
        maps.append((path, mmap.mmap(f.fileno(), 0)))
lock = multiprocessing.get_context("spawn").Lock() if with_lock else multiprocessing.Lock()


def report(*_):
    for path, m in maps:
        print(f"map {path} {m[:16].decode(errors='replace')}", flush=True)


signal.signal(signal.SIGUSR1, report)
sem = f"/dev/shm/sem.{lock._semlock.name.lstrip('/')}" if with_lock else "-"
print(f"ready pid={os.getpid()} sem={sem}", flush=True)
while True:
    with lock:
        time.sleep(0.01)
