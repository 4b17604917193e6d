"""`coldsnap sleep NAME` and `coldsnap wake NAME`: release a restored engine's weights and KV
cache and give them back later, without a snapshot (what vLLM's sleep mode does).

Sleep goes through the plugin's release path (the engine's release endpoint; the plugin closes
its health gate, so requests wait and /health answers 503): the server stays up with its
memory freed. Wake writes the resume plan the restore used (the capsule's payload laid out in
the restore's workdir, or the pinned checkpoint, with the restore's seed) and resumes through
the plugin's resume path, which refills the weights before it returns; then it waits until the
engine is healthy. The state is `asleep.json` in the restore's workdir (written atomically,
under the workdir's lock), which `coldsnap status` reads."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psutil

from coldsnap._atomic import write_json_atomic
from coldsnap._wire import KV_CACHE, WEIGHTS, plan_from, write_plan
from coldsnap.engines import EngineClient, EngineError
from coldsnap.engines.sglang import SGLANG_POLICY, scheduler_records
from coldsnap.machine._journal import workdir_lock

from ._serving import ServingError, engine_alive, receipt

ASLEEP_NAME = "asleep.json"
_WAKE_HEALTH_S = 120.0


def asleep(workdir: Path) -> dict[str, Any] | None:
    """The sleep record of the engine restored in `workdir`, None while it is awake."""
    try:
        data = json.loads((workdir / ASLEEP_NAME).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ServingError(f"{workdir / ASLEEP_NAME}: not a sleep record ({exc})") from None
    return data if isinstance(data, dict) else None


def _engine(workdir: Path) -> dict[str, Any]:
    """The restore's facts, once its engine is known to run."""
    done = receipt(workdir)
    facts = (done or {}).get("facts") or {}
    if not done or done.get("operation") != "restore" or done.get("outcome") != "done":
        raise ServingError(f"{workdir}: no finished restore here, so no engine to put to sleep")
    if not engine_alive(facts.get("engine_pid"), facts.get("runtime_dir")):
        raise ServingError(f"{workdir}: its engine (pid {facts.get('engine_pid')}) is not running")
    return facts


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and every process below it."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue  # ended between the listing and the read
    return total


def _released(runtime_dir: Path, since: float) -> dict[str, Any]:
    """What the schedulers' status records say this release freed: `host_bytes` (weight pages
    returned to the kernel, the CPU backend), `device_freed` (device bytes measured freed on
    CUDA; None where none was measured) and `exported` (whether the plugin also wrote a
    payload); EngineError naming a scheduler whose release failed or whose record is unreadable."""
    freed: int | None = None
    host, exported = 0, False
    for name, record in scheduler_records(runtime_dir, "sleep").items():
        if record.get("outcome") == "failed":
            raise EngineError("sleep", f"{name}: the plugin refused: {record.get('error')}")
        for event in record.get("events") or ():
            if event.get("event") == "released" and float(event.get("time", 0)) >= since:
                host += int(event.get("discarded_bytes") or 0)
                exported = exported or bool(event.get("export"))
        report = record.get("cuda_release")
        fresh = isinstance(report, dict) and float(report.get("at", 0)) >= since
        if fresh and report.get("device_freed") is not None:
            freed = (freed or 0) + int(report["device_freed"])
    return {"host_bytes": host, "device_freed": freed, "exported": exported}


def sleep(workdir: Path) -> dict[str, Any]:
    """Releases the engine's weights and KV cache; returns what was freed. Idempotent: an
    engine already asleep is reported as such, untouched."""
    with workdir_lock(workdir):
        facts = _engine(workdir)
        already = asleep(workdir)
        if already is not None:
            return {**already, "already": True}
        pid, runtime_dir = int(facts["engine_pid"]), Path(facts["runtime_dir"])
        before, started = tree_rss(pid), time.time()
        with EngineClient(facts["engine_url"], SGLANG_POLICY) as client:
            client.flush_cache()  # the release needs an idle scheduler
            client.release([KV_CACHE, WEIGHTS])
            write_json_atomic(workdir / ASLEEP_NAME, {"at": started, "pid": pid})  # released
            try:
                healthy: bool | None = client.health()
            except EngineError:
                healthy = None  # neither 200 nor 503: reported as unknown
        after = tree_rss(pid)
        record = {
            "at": started,
            "pid": pid,
            "rss_before": before,
            "rss_after": after,
            "rss_freed": before - after,
            **_released(runtime_dir, started),
            "healthy_while_asleep": healthy,
            "seconds": round(time.time() - started, 3),
        }
        write_json_atomic(workdir / ASLEEP_NAME, record)
    return {**record, "already": False}


def wake(workdir: Path, *, health_timeout_s: float = _WAKE_HEALTH_S) -> dict[str, Any]:
    """Refills the weights from where the restore took them and resumes the KV cache; waits
    until the engine is healthy. Idempotent: an awake engine is reported as such."""
    with workdir_lock(workdir):
        facts = _engine(workdir)
        if asleep(workdir) is None:
            return {"already": True, "seconds": 0.0}
        source = facts.get("weight_source")
        if not isinstance(source, dict):
            raise ServingError(f"{workdir}: the restore's receipt names no weight source")
        payload = source.get("payload_dir")
        if payload and not Path(payload).is_dir():
            raise ServingError(
                f"the payload {payload} the engine was restored from is gone: it cannot be "
                "refilled (stop it and restore again)"
            )
        started = time.monotonic()
        plan = plan_from({**source, "seed": facts.get("resume_seed")}, where="weight source")
        write_plan(Path(facts["runtime_dir"]), plan)
        with EngineClient(facts["engine_url"], SGLANG_POLICY) as client:
            client.resume([WEIGHTS])  # the plugin refills them before it answers
            client.resume([KV_CACHE])
            client.wait_healthy(health_timeout_s)
        (workdir / ASLEEP_NAME).unlink()
    return {"already": False, "seconds": round(time.monotonic() - started, 3)}


__all__ = ["ASLEEP_NAME", "asleep", "sleep", "tree_rss", "wake"]
