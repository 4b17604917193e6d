"""Issue 4's template benchmark: restoring an n580 template that has imported torch and SGLang's
server modules, against a cold `python -c "import torch, sglang.srt.entrypoints.http_server"`,
side by side in one run. Prints the ratio of medians and the absolute seconds.

    .venv/bin/python bench/bench_template.py [--repeats 5]
    .venv/bin/python bench/bench_template.py --launch [--repeats 3]

A restore counts as done when the restored template, released into a no-op module, reports
`released`: it is then running Python with every module imported, as the cold run is at exit.

`--launch` times what a capture's `launch_template` waits for instead: SGLang's template
imports (SGLangLauncher.template_preload) and its forkserver's (forkserver_preload), with the
forkserver started after the template's imports (as it was before) against started
beside them (`_forkserver.begin` ... `ready`, what the template does now), interleaved.
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


_LAUNCH = """
import importlib, sys, time
from coldsnap.drivers.n580 import _forkserver
preload, forkserver, beside = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3] == "1"
if beside:
    _forkserver.begin(forkserver)
for module in preload:
    importlib.import_module(module)
_forkserver.ready() if beside else _forkserver.start(forkserver)
"""


def launch_ab(repeats: int) -> None:
    from coldsnap.engines.sglang import SGLangLauncher

    env = cpu_env()
    preload = ",".join(SGLangLauncher.template_preload)
    forkserver = ",".join(SGLangLauncher.forkserver_preload or ())
    times: dict[str, list[float]] = {"after": [], "beside": []}
    for i in range(repeats):
        for how in ("after", "beside") if i % 2 == 0 else ("beside", "after"):
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-c", _LAUNCH, preload, forkserver, str(int(how == "beside"))],
                env=env,
                check=True,
            )
            times[how].append(time.perf_counter() - started)
            print(f"  {how:6} {times[how][-1]:.2f} s (load {os.getloadavg()[0]:.2f})")
    after, beside = statistics.median(times["after"]), statistics.median(times["beside"])
    print(f"forkserver started after the imports:  median {after:.2f} s")
    print(f"forkserver started beside the imports: median {beside:.2f} s ({after / beside:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--launch", action="store_true", help="time the template's imports")
    args = parser.parse_args()
    if args.launch:
        launch_ab(args.repeats)
        return
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
