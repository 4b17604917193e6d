"""A real SGLang server on the small model (~256 MB of bf16 weights, which dominate the
scheduler's memory): releasing the weights gives their memory back, native hydration refills
them bit-exactly at the same storages, and health stays closed while hydration runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coldsnap._wire import ResumePlan, write_plan
from coldsnap.engines import EngineClient
from coldsnap.engines.sglang import SGLANG_POLICY

from .conftest import generate_all, plugin_env, read_status, scheduler_process, stop_now

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.xdist_group("host")]


@pytest.fixture(scope="module")
def small(
    sglang_cpu: None, models_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    from coldsnap.testing.sglang_cpu import start_server
    from coldsnap.tiny_models import build_model

    model = build_model(models_root / "llama-small", arch="llama", size="small", seed=0)
    base = tmp_path_factory.mktemp("small-server")
    env = plugin_env(
        base / "run", COLDSNAP_EXPORT_MODEL_PAYLOAD="1", COLDSNAP_ARTIFACT_DIR=str(base / "art")
    )
    with start_server(model.path, log_path=base / "server.log", env=env) as server, \
            EngineClient(server.url, SGLANG_POLICY) as client:  # fmt: skip
        yield {
            "server": server,
            "client": client,
            "runtime": base / "run",
            "model": model,
            "cold": generate_all(client),
            "checksum": client.weights_checksum()["per_engine_checksum"],
        }
        stop_now(server)


def test_release_frees_the_weights_and_native_resume_refills_them(small: dict[str, Any]) -> None:
    client, runtime, weight_bytes = small["client"], small["runtime"], small["model"].weight_bytes
    assert weight_bytes > 250_000_000
    sched = scheduler_process(small["server"].pid)
    rss_before = sched.memory_info().rss
    client.release()
    rss_released = sched.memory_info().rss
    status = read_status(runtime, "scheduler-tp0")
    assert status["freed_by"] == "host_discard"
    assert status["discarded_bytes"] >= weight_bytes
    assert rss_before - rss_released >= 0.9 * weight_bytes, (rss_before, rss_released)
    # The weights are a large share of the scheduler's memory (the rest is torch and SGLang
    # themselves, about 0.75 GB), so the drop above is a visible part of the whole.
    assert weight_bytes >= 0.2 * rss_before, (weight_bytes, rss_before)

    write_plan(runtime, ResumePlan(source="payload", payload_dir=status["export"]["root"]))
    probes: list[tuple[float, int, int]] = []
    done = threading.Event()

    def probe() -> None:
        with EngineClient(small["server"].url, SGLANG_POLICY) as c:
            while not done.is_set():
                t = time.time()
                probes.append((t, int(c.health()), int(c.ready())))

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        client.resume()
    finally:
        done.set()
        thread.join()

    events = {e["event"]: e["time"] for e in read_status(runtime, "scheduler-tp0")["events"]}
    during = [p for p in probes if events["resuming"] <= p[0] <= events["resumed"]]
    assert during, "no health probe landed while the scheduler was hydrating"
    assert all(h == 0 and r == 0 for _, h, r in during), during
    assert client.health() is True and client.ready() is True

    detail = read_status(runtime, "scheduler-tp0")["resume"]
    assert detail["storages_unchanged"] is True
    assert detail["hydrated"]["target"]["nbytes"] >= weight_bytes
    assert sched.memory_info().rss - rss_released >= 0.9 * weight_bytes
    assert client.weights_checksum()["per_engine_checksum"] == small["checksum"]
    assert generate_all(client) == small["cold"]
