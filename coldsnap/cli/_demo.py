"""`coldsnap demo`. Until the real end-to-end path exists it is the dry run, and says so."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import click

from coldsnap.drivers.memory import MemoryWorld, memory_components
from coldsnap.machine import CaptureRequest, Machine, ModelRef, RestoreRequest


def run_demo(*, dry_run: bool) -> int:
    click.echo(
        "DRY RUN: the in-memory driver stands in for CRIU, CUDA and SGLang; no process is "
        "snapshotted. Times below are the state machines' own overhead."
    )
    world = MemoryWorld()
    with tempfile.TemporaryDirectory(prefix="coldsnap-demo-") as tmp:
        root = Path(tmp)
        (root / "model").mkdir()
        model = ModelRef(id="tiny-llama", revision="dry-run", path=str(root / "model"))
        for driver in ("n610", "n580"):
            for provider in ("native", "recovery"):
                machine = Machine(**memory_components(world, driver, provider))
                started = time.perf_counter()
                cap = machine.capture(
                    CaptureRequest(
                        driver=driver,
                        provider=provider,
                        model=model,
                        name=f"{driver}-{provider}",
                        workdir=str(root / f"cap-{driver}-{provider}"),
                        store=str(root / "store"),
                    )
                )
                capture_s = time.perf_counter() - started
                started = time.perf_counter()
                res = machine.restore(
                    RestoreRequest(
                        driver=driver,
                        provider=provider,
                        model=model,
                        artifact=f"{driver}-{provider}",
                        workdir=str(root / f"res-{driver}-{provider}"),
                        store=str(root / "store"),
                    )
                )
                restore_s = time.perf_counter() - started
                click.echo(
                    f"{driver} {provider:<8} capture {cap.outcome} "
                    f"({len(cap.steps)} steps, {capture_s * 1e3:.1f} ms)  "
                    f"restore {res.outcome} ({len(res.steps)} steps, "
                    f"{restore_s * 1e3:.1f} ms)"
                )
                if not (cap.ok and res.ok):
                    return 1
                machine.stop(res)
    click.echo("DRY RUN complete: capture and restore ran every step of all four specs.")
    return 0
