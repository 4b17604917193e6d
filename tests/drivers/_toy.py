"""Shared by the real-driver tests: a toy model, requests, a cold engine, live-process scans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from coldsnap.backends import Criu
from coldsnap.machine import CaptureRequest, ModelRef, RestoreRequest

PROMPTS = ["hello", "The quick brown fox", "snapshots restore in seconds", "a"]
MARKERS = ("coldsnap.testing.toy_engine", "coldsnap.drivers.n580._template")


def criu_ready() -> str | None:
    """Why the real drivers cannot run here, or None."""
    if os.geteuid() != 0:
        return "CRIU needs root"
    return Criu().problem()


needs_criu = pytest.mark.skipif(criu_ready() is not None, reason=str(criu_ready()))


def model_ref(path: Path) -> ModelRef:
    return ModelRef(id="toy", revision="r1", path=str(path))


def capture_request(
    root: Path, model: Path, driver: str, provider: str, name: str, **kw
) -> CaptureRequest:
    return CaptureRequest(
        driver=driver,
        provider=provider,
        model=model_ref(model),
        engine="toy",
        workdir=str(root / f"cap-{name}"),
        store=str(root / "store"),
        name=name,
        **kw,
    )


def restore_request(
    root: Path, model: Path, driver: str, provider: str, name: str, workdir: str
) -> RestoreRequest:
    return RestoreRequest(
        driver=driver,
        provider=provider,
        model=model_ref(model),
        engine="toy",
        artifact=name,
        workdir=str(root / workdir),
        store=str(root / "store"),
    )


def answers(url: str) -> list[list[int]]:
    out = []
    for prompt in PROMPTS:
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
        out.append(httpx.post(f"{url}/generate", json=body, timeout=30).json()["output_ids"])
    return out


def cold_answers(model: Path, port: int) -> list[list[int]]:
    """A plain start of the toy engine, nothing snapshotted: what every restore must equal."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coldsnap.testing.toy_engine",
            "--model-path",
            str(model),
            "--port",
            str(port),
        ]
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the cold toy engine did not start"
            time.sleep(0.1)
        return answers(url)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def live_engines() -> frozenset[str]:
    """Engines and templates among this process's descendants (the drivers make it a child
    subreaper, so restored trees are adopted here)."""
    found = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline())
            if proc.status() != psutil.STATUS_ZOMBIE and any(m in cmdline for m in MARKERS):
                found.add(f"process:{proc.pid}")
        except psutil.NoSuchProcess:
            continue
    return frozenset(found)
