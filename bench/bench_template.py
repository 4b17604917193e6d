"""Issue 4's template benchmark: restoring an n580 template that has imported torch and SGLang's
server modules, against a cold `python -c "import torch, sglang.srt.entrypoints.http_server"`,
side by side in one run. Prints the ratio of medians and the absolute seconds.

    .venv/bin/python bench/bench_template.py [--repeats 5]

A restore counts as done when the restored template, released into a no-op module, reports
`released`: it is then running Python with every module imported, as the cold run is at exit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from coldsnap.backends import Criu, become_subreaper, launch, reap_children, stop_tree
from coldsnap.drivers.n580._template import RELEASE, STATUS
from coldsnap.testing.sglang_cpu import cpu_env

MODULES = ("torch", "sglang.srt.entrypoints.http_server")


def _wait(control: Path, state: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads((control / STATUS).read_text()).get("state") == state:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.002)
    raise TimeoutError(f"template did not reach {state}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    become_subreaper()
    env = cpu_env()
    root = Path(tempfile.mkdtemp(prefix="bench-template-", dir="/var/tmp"))
    control = Path("/run/coldsnap/templates") / uuid.uuid4().hex
    criu = Criu()
    try:
        launched = launch(
            [
                sys.executable,
                "-m",
                "coldsnap.drivers.n580._template",
                "--control",
                str(control),
                "--preload",
                ",".join(MODULES),
            ],
            env=env,
            log_path=root / "template.log",
        )
        _wait(control, "waiting")
        manifest = criu.dump(launched.pid, root / "image")
        launched.wait(30)
        cold, warm = [], []
        for i in range(args.repeats):
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-c", f"import {', '.join(MODULES)}"], env=env, check=True
            )
            cold.append(time.perf_counter() - started)
            (control / STATUS).unlink(missing_ok=True)
            started = time.perf_counter()
            tree = criu.restore(root / "image", work_dir=root / f"restore-{i}")
            order = {"module": "this", "args": [], "env": {}}
            (control / f".{RELEASE}").write_text(json.dumps(order))
            os.replace(control / f".{RELEASE}", control / RELEASE)
            _wait(control, "released")
            warm.append(time.perf_counter() - started)
            stop_tree(tree.pid, 10)
            reap_children()
        c, w = statistics.median(cold), statistics.median(warm)
        print(
            f"template image {manifest.image_bytes / 2**20:.0f} MiB, dump {manifest.seconds:.2f} s"
        )
        print(f"cold import     median {c:.3f} s  (runs: {', '.join(f'{x:.2f}' for x in cold)})")
        print(f"template restore median {w:.3f} s  (runs: {', '.join(f'{x:.2f}' for x in warm)})")
        print(f"ratio cold/restore: {c / w:.1f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(control, ignore_errors=True)


if __name__ == "__main__":
    main()
