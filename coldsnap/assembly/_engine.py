"""The engine steps of the machines over the engine-neutral HTTP client and the plugin's files.

What runs inside the engine (export on release, hydration or recovery on resume, the health
gate) is the plugin's work; these steps ask for it over HTTP and read the plugin's status.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import os
import time
from pathlib import Path
from typing import Any

from coldsnap.engines import EngineClient, EngineError, EnginePolicy
from coldsnap.machine import Skipped, StepContext
from coldsnap.plugin import ResumePlan, write_plan

WEIGHTS, KV_CACHE, CUDA_GRAPH = "weights", "kv_cache", "cuda_graph"


class HttpEngine:
    """Engine steps for any engine that speaks the policy's endpoints."""

    def __init__(self, policy: EnginePolicy, *, graphs: bool = True) -> None:
        self.name = policy.name
        self.policy = policy
        self.graphs = graphs
        self.timeouts: dict[str, float] = {}

    def client(self, ctx: StepContext) -> EngineClient:
        return EngineClient(ctx.facts["engine_url"], self.policy)

    # -- health and acceptance ----------------------------------------------------------------

    def wait_healthy(self, ctx: StepContext) -> dict[str, Any]:
        """Polls readiness, which answers at once. SGLang's /health sends a one-token request
        and then sleeps a whole second before it looks for the answer, so it cannot say
        "healthy" sooner than 1 s; the acceptance request that follows proves generation.
        Engines without a readiness endpoint are polled on their health endpoint."""
        started = time.monotonic()
        with self.client(ctx) as client:
            while True:
                ctx.check()
                try:
                    if client.ready():
                        break
                except EngineError as exc:
                    if exc.status == 404:
                        client.wait_healthy(ctx.remaining(), check=ctx.check)
                        break
                time.sleep(0.02)
        return {"healthy_after_s": round(time.monotonic() - started, 3)}

    def record_acceptance(self, ctx: StepContext) -> dict[str, Any]:
        with self.client(ctx) as client:
            return {"acceptance_tokens": list(client.acceptance_tokens())}

    def check_acceptance(self, ctx: StepContext) -> dict[str, Any]:
        with self.client(ctx) as client:
            tokens = client.accept(ctx.facts["capsule"]["acceptance_tokens"])
        return {"acceptance_tokens": list(tokens)}

    # -- capture ------------------------------------------------------------------------------

    def quiesce(self, ctx: StepContext) -> None:
        with self.client(ctx) as client:
            client.flush_cache()  # SGLang flushes only when idle: it fails while requests run

    def unquiesce(self, ctx: StepContext) -> None:
        return None  # quiesce admits no new state; nothing to undo

    def release_memory(self, ctx: StepContext) -> dict[str, Any]:
        with self.client(ctx) as client:
            client.release([KV_CACHE, WEIGHTS])
        runtime = ctx.facts.get("runtime_dir")
        return {"payload_dir": str(Path(runtime) / "payload")} if runtime else {}

    def resume_memory(self, ctx: StepContext) -> None:
        """Undoes a release at capture: the weights come back from the model's own checkpoint."""
        if not _alive(ctx):
            return
        _plan(ctx, ResumePlan(provider="recovery", checkpoint=ctx.request.model.path))
        with self.client(ctx) as client:
            client.resume([WEIGHTS, KV_CACHE])

    def destroy_graphs(self, ctx: StepContext) -> Skipped | None:
        if not self.graphs:
            return Skipped("the engine captures no CUDA graphs here")
        with self.client(ctx) as client:
            client.release([CUDA_GRAPH])
        return None

    def recapture_graphs(self, ctx: StepContext) -> None:
        if self.graphs and _alive(ctx):
            with self.client(ctx) as client:
                client.resume([CUDA_GRAPH])

    def prepare_nccl(self, ctx: StepContext) -> Skipped | None:
        if ctx.request.tp == 1:
            return Skipped("one rank: no communicator to prepare")
        return None  # the plugin prepares communicators inside release, on every rank

    def restore_nccl(self, ctx: StepContext) -> Skipped | None:
        return Skipped("the plugin restores communicators inside resume, on every rank")

    def tp_barrier(self, ctx: StepContext) -> Skipped | None:
        if ctx.request.tp == 1:
            return Skipped("one rank: nothing to wait for")
        return None

    # -- restore ------------------------------------------------------------------------------

    def resume_weights(self, ctx: StepContext) -> dict[str, Any]:
        """Writes the resume plan, then resumes the weights; the plugin hydrates (native) or
        reloads the pinned checkpoint (recovery) before the call returns."""
        # A fresh seed per restore, the same for every rank of this one.
        seed = int.from_bytes(os.urandom(8), "little") >> 1
        if ctx.request.provider == "native":
            plan = ResumePlan(
                provider="native",
                payload_dir=ctx.facts["payload_dir"],
                preverified=bool(ctx.facts.get("payload_verified")),
                seed=seed,
            )
        else:
            plan = ResumePlan(provider="recovery", checkpoint=ctx.request.model.path, seed=seed)
        _plan(ctx, plan)
        with self.client(ctx) as client:
            client.resume([WEIGHTS])
        return {"resume_plan": plan.provider}

    def update_weights_from_disk(self, ctx: StepContext) -> Skipped:
        return Skipped("the plugin reloaded the pinned checkpoint when the weights resumed")

    def resume_rest(self, ctx: StepContext) -> None:
        tags = [KV_CACHE, CUDA_GRAPH] if self.graphs else [KV_CACHE]
        with self.client(ctx) as client:
            client.resume(tags)

    def open_health_gate(self, ctx: StepContext) -> dict[str, Any]:
        return self.wait_healthy(ctx)

    def close_health_gate(self, ctx: StepContext) -> None:
        return None  # the gate closes by itself when the process is stopped

    # -- identity -----------------------------------------------------------------------------

    def build(self) -> tuple[str, str, str]:
        """(engine name, version, contract digest) of the engine installed here."""
        if self.name == "sglang":
            from coldsnap.plugin import digest

            return "sglang", importlib.metadata.version("sglang"), digest()
        from coldsnap.testing import toy_engine

        source = inspect.getsource(toy_engine).encode()
        return self.name, "1", "sha256:" + hashlib.sha256(source).hexdigest()


def _plan(ctx: StepContext, plan: ResumePlan) -> None:
    write_plan(Path(ctx.facts["runtime_dir"]), plan)


def _alive(ctx: StepContext) -> bool:
    import psutil

    pid = ctx.facts.get("engine_pid")
    return pid is not None and psutil.pid_exists(pid)
