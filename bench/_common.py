"""The start-up the benchmarks of a real SGLang server share: the argument check, the host check,
the work directory, the tiny model and the capture request. Kept here so that every benchmark
measures the same model, in the same place, refused on the same host problems.

Imported by the scripts of this folder, which run as `python bench/NAME.py` (this folder is
first on their import path)."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from coldsnap.machine import CaptureRequest, ModelRef

if TYPE_CHECKING:
    from coldsnap.tiny_models import ModelInfo

WORK_ROOT = "/var/tmp"
"""Where work directories go: on disk (not a tmpfs), as a store and its captures would be."""


def at_least_one(parser: argparse.ArgumentParser, option: str, value: int) -> None:
    """Stops with a usage error when a count option is below 1."""
    if value < 1:
        parser.error(f"{option} must be at least 1")


def host_problem(tool: str) -> bool:
    """Prints why this host cannot run a real capture (root, CRIU, SGLang) and returns True;
    False where it can."""
    from coldsnap.cli._demo import ready_host

    problem = ready_host()
    if problem:
        print(f"{tool}: {problem}", file=sys.stderr)
        return True
    return False


def load() -> str:
    """The load average, for the lines that say how quiet the machine was."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@contextlib.contextmanager
def work_dir(tool: str, *, keep: bool = False) -> Iterator[Path]:
    """A fresh work directory under WORK_ROOT, announced with the machine's load, removed at
    the end unless `keep`."""
    root = Path(tempfile.mkdtemp(prefix=f"{tool.replace('_', '-')}-", dir=WORK_ROOT))
    print(f"{tool}: work dir {root}; load average at start {load()}; {os.cpu_count()} cpus")
    try:
        yield root
    finally:
        if keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def tiny_llama(root: Path, size: str = "tiny") -> tuple[ModelInfo, ModelRef]:
    """The random Llama every benchmark serves (seed 0), built under `root`, and its reference."""
    from coldsnap.tiny_models import build_model

    info = build_model(root / "model", arch="llama", size=size, seed=0)
    return info, ModelRef(id=f"bench-{size}-llama", revision="seed0", path=str(info.path))


def capture_request(
    root: Path, model: ModelRef, driver: str, provider: str, name: str, workdir: str = "capture"
) -> CaptureRequest:
    """A capture of `model` on SGLang into the store under `root`."""
    return CaptureRequest(
        driver=driver,
        provider=provider,
        model=model,
        engine="sglang",
        name=name,
        workdir=str(root / workdir),
        store=str(root / "store"),
    )
