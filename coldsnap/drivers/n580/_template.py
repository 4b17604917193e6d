"""The n580 template process: import the heavy modules, then wait to be told what to run.

Run as `python -m coldsnap.drivers.n580._template --control DIR --preload MOD[,MOD...]`. It
creates no CUDA context (the driver checks its mappings before the dump), polls DIR for
`release.json` (a plain file poll holds no descriptor that a snapshot would have to carry), and
on release becomes the engine: environment and argv from the file, random generators reseeded
(every restored copy starts with the template's state), then `runpy` runs the engine's module as
`__main__` in this already-warm interpreter.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import runpy
import sys
import time
from pathlib import Path

from coldsnap._atomic import write_json_atomic

from . import _forkserver
from ._forkserver import reseed

RELEASE = "release.json"
STATUS = "status.json"
POLL_S = 0.005


def _status(control: Path, state: str, **extra: object) -> None:
    record = {"format": 1, "kind": "coldsnap.template-status", "state": state,
              "pid": os.getpid(), **extra}  # fmt: skip
    write_json_atomic(control / STATUS, record)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="coldsnap-template")
    parser.add_argument("--control", required=True, type=Path)
    parser.add_argument("--preload", default="")
    parser.add_argument("--forkserver-preload", default=None)
    args = parser.parse_args(argv)
    started = time.monotonic()
    extra: dict[str, object] = {}
    if args.forkserver_preload is not None:  # it imports beside this process, not after it
        _forkserver.begin(list(filter(None, args.forkserver_preload.split(","))))
    for module in filter(None, args.preload.split(",")):
        importlib.import_module(module)
    if args.forkserver_preload is not None:
        extra["forkserver_address"] = _forkserver.ready()
    args.control.mkdir(parents=True, exist_ok=True)
    _status(args.control, "waiting", import_seconds=round(time.monotonic() - started, 3), **extra)
    release = args.control / RELEASE
    while not release.exists():
        time.sleep(POLL_S)
    order = json.loads(release.read_text())
    release.unlink()
    os.environ.update(order.get("env", {}))
    if order.get("cwd"):
        os.chdir(order["cwd"])
    reseed()
    _status(args.control, "released", module=order["module"])
    sys.argv = [order["module"], *order.get("args", [])]
    runpy.run_module(order["module"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
