"""The engine role of the machines for SGLang with coldsnap's plugin.

What runs inside the engine (export on release, hydration or recovery on resume, the health
gate) is the plugin's work; each step here asks for it over SGLang's HTTP endpoints and hands
it the files of coldsnap._wire. Each step reads the facts its shared step
(coldsnap.machine.steps) `needs` and returns only facts that step `makes`.
"""

from __future__ import annotations

import importlib.metadata
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

from coldsnap._wire import CUDA_GRAPH, KV_CACHE, WEIGHTS, ResumePlan, plan_from, write_plan
from coldsnap.engines import EngineClient, EngineError, EnginePolicy
from coldsnap.machine import Launcher, StepContext
from coldsnap.machine import steps as s

from ._launcher import export_dir
from ._policy import SGLANG_POLICY

Identity = Callable[[], tuple[str, str, str]]
"""() -> (engine name, version, contract digest): what the store binds into capsules."""

_LOG_TAIL_CHARS = 4000


def installed_sglang() -> tuple[str, str, str]:
    """SGLang's installed version and the digest of the contracts the plugin checks in it."""
    from coldsnap.plugin import digest

    return "sglang", importlib.metadata.version("sglang"), digest()


class SGLangEngine:
    """Engine steps for SGLang (or any engine that speaks `policy`'s endpoints and the plugin's
    files). Capability `cuda_graphs` when `graphs`: the engine then captures CUDA graphs, and
    the specs' graph steps (destroy_graphs, with recapture_graphs as its undo) run."""

    def __init__(
        self,
        launcher: Launcher,
        *,
        policy: EnginePolicy = SGLANG_POLICY,
        graphs: bool = False,
        name: str = "sglang",
        identity: Identity | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.name = name
        self.launcher = launcher
        self.policy = policy
        self.graphs = graphs
        self.capabilities: frozenset[str] = frozenset({"cuda_graphs"} if graphs else ())
        self._identity = identity or installed_sglang
        self._transport = transport  # tests hand an httpx.MockTransport

    def build(self) -> tuple[str, str, str]:
        """(engine name, version, contract digest) of the engine installed here."""
        return self._identity()

    def _client(self, ctx: StepContext) -> EngineClient:
        return EngineClient(ctx.facts[s.ENGINE_URL.name], self.policy, transport=self._transport)

    # -- health and acceptance ----------------------------------------------------------------

    def wait_healthy(self, ctx: StepContext) -> dict[str, Any]:
        """Polls readiness, which answers at once (SGLang's /health sends a one-token request
        and sleeps a whole second before it looks for the answer; the acceptance request that
        follows proves generation). An engine without /ready is polled on /health. Fails at
        once, with the tail of the engine's log, when the engine's process has ended."""
        started = time.monotonic()
        pid = int(ctx.facts[s.ENGINE_PID.name])
        on_health = False
        with self._client(ctx) as client:
            while True:
                ctx.check()
                if not _running(pid):
                    raise EngineError(
                        "wait_healthy",
                        f"the engine (pid {pid}) ended before it was ready{_log_tail(ctx)}",
                    )
                try:
                    if client.health() if on_health else client.ready():
                        break
                except EngineError as exc:  # not serving yet (connection refused)
                    on_health = on_health or exc.status == 404  # no /ready: poll /health
                time.sleep(0.02)
        return {s.HEALTHY_AFTER_S.name: round(time.monotonic() - started, 3)}

    def record_acceptance(self, ctx: StepContext) -> dict[str, Any]:
        with self._client(ctx) as client:
            return {s.ACCEPTANCE_TOKENS.name: list(client.acceptance_tokens())}

    def check_acceptance(self, ctx: StepContext) -> dict[str, Any]:
        recorded = ctx.facts[s.CAPSULE.name].get(s.ACCEPTANCE_TOKENS.name)
        if not recorded:
            raise EngineError("acceptance", "the capsule records no acceptance tokens to compare")
        with self._client(ctx) as client:
            tokens = client.accept(recorded)
        return {s.ACCEPTANCE_TOKENS.name: list(tokens)}

    # -- capture ------------------------------------------------------------------------------

    def quiesce(self, ctx: StepContext) -> None:
        """Flushes the prefix cache; SGLang refuses (and the step fails) while a request runs."""
        with self._client(ctx) as client:
            client.flush_cache()

    def release_memory(self, ctx: StepContext) -> dict[str, Any]:
        """Releases the KV cache and the weights; an engine started to export writes its
        payload under the runtime directory first (the plugin refuses the release if it
        cannot)."""
        with self._client(ctx) as client:
            client.release([KV_CACHE, WEIGHTS])
        runtime_dir = Path(ctx.facts[s.RUNTIME_DIR.name])
        return {s.EXPORT_DIR.name: str(export_dir(runtime_dir))}

    def resume_memory(self, ctx: StepContext) -> None:
        """Undoes release at capture: the weights come back from the model's own checkpoint.
        An engine whose process has ended holds nothing to give back."""
        if not _running(int(ctx.facts[s.ENGINE_PID.name])):
            return
        plan = ResumePlan(provider="recovery", checkpoint=ctx.request.model.path)
        write_plan(Path(ctx.facts[s.RUNTIME_DIR.name]), plan)
        with self._client(ctx) as client:
            client.resume([WEIGHTS, KV_CACHE])

    def destroy_graphs(self, ctx: StepContext) -> None:
        with self._client(ctx) as client:
            client.release([CUDA_GRAPH])

    def recapture_graphs(self, ctx: StepContext) -> None:
        """Undoes destroy_graphs on a live engine (an ended one has no graphs to bring back)."""
        if not _running(int(ctx.facts[s.ENGINE_PID.name])):
            return
        with self._client(ctx) as client:
            client.resume([CUDA_GRAPH])

    # -- restore ------------------------------------------------------------------------------

    def resume_weights(self, ctx: StepContext) -> dict[str, Any]:
        """Writes the provider's weight source as the resume plan, with a fresh seed for this
        restore (the same for every rank), then resumes the weights; the plugin hydrates the
        payload or reloads the pinned checkpoint before the call returns."""
        seed = int.from_bytes(os.urandom(8), "little") >> 1
        source = ctx.facts[s.WEIGHT_SOURCE.name]
        plan = plan_from({**source, "seed": seed}, where=f"weight source {source!r}")
        write_plan(Path(ctx.facts[s.RUNTIME_DIR.name]), plan)
        with self._client(ctx) as client:
            client.resume([WEIGHTS])
        return {s.RESUME_SEED.name: seed}

    def resume_rest(self, ctx: StepContext) -> None:
        tags = [KV_CACHE, CUDA_GRAPH] if self.graphs else [KV_CACHE]
        with self._client(ctx) as client:
            client.resume(tags)


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie has ended; it may not be our child)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _log_tail(ctx: StepContext) -> str:
    path = ctx.facts.get(s.ENGINE_LOG.name)
    if not path:
        return " (no engine log recorded)"
    try:
        tail = Path(path).read_text(errors="replace")[-_LOG_TAIL_CHARS:]
    except OSError as exc:
        return f"; its log {path} cannot be read: {exc}"
    return f"; the tail of its log {path}:\n{tail}"


__all__ = ["Identity", "SGLangEngine", "installed_sglang"]
