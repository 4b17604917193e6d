"""x100's steps, over the in-memory world of coldsnap.testing."""

from __future__ import annotations

import os
from typing import Any

from coldsnap.machine import StepContext, launch_weights
from coldsnap.machine import steps as s
from coldsnap.testing import MemoryLauncher

from ._specs import PARK_SECONDS, SLOT


class X100Driver:
    """Starts the engine through the engine adapter's launcher, parks it in a slot of the world,
    and unparks it. It moves no CUDA state: no capabilities."""

    name = "x100"
    capabilities: frozenset[str] = frozenset()

    def __init__(self, launcher: MemoryLauncher) -> None:
        self.launcher = launcher
        self.world = launcher.world

    @staticmethod
    def _slot(ctx: StepContext) -> str:
        return f"slot:{os.path.basename(ctx.request.workdir.rstrip('/'))}"

    def start_engine(self, ctx: StepContext) -> dict[str, Any]:
        command = self.launcher.command(ctx.request, ctx.workdir, weights=launch_weights(ctx))
        pid = self.world.spawn(**self.world.boot(command, ctx.request))
        ctx.record(**{s.ENGINE_PID.name: pid})  # before anything else: a rollback must find it
        return {
            s.ENGINE_PID.name: pid,
            s.ENGINE_URL.name: command.url,
            s.ENGINE_LOG.name: str(ctx.workdir / "engine.log"),
            s.RUNTIME_DIR.name: command.env["COLDSNAP_RUNTIME_DIR"],
        }

    def stop_engine(self, ctx: StepContext) -> None:
        self.world.kill(ctx.facts.get(s.ENGINE_PID.name))

    def park(self, ctx: StepContext) -> dict[str, Any]:
        proc = self.world.process(ctx.facts[s.ENGINE_PID.name])
        if proc["weights"] != "released":
            raise RuntimeError("x100 parks only an engine whose weights are released")
        slot = self._slot(ctx)
        self.world.resources[slot] = dict(proc)
        return {
            s.IMAGE_DIR.name: slot,
            s.IMAGE_BYTES.name: len(repr(proc)),
            SLOT.name: slot,
            PARK_SECONDS.name: 0.0,
        }

    def unpark_slot(self, ctx: StepContext) -> None:
        self.world.resources.pop(self._slot(ctx), None)

    def unpark(self, ctx: StepContext) -> dict[str, Any]:
        capsule = ctx.facts[s.CAPSULE.name]
        if not capsule.get(SLOT.name, "").startswith("slot:"):
            raise RuntimeError(f"the capsule carries no x100 slot: {sorted(capsule)}")
        image = self.world.read(ctx.facts[s.IMAGE_DIR.name])
        pid = self.world.spawn(**image)
        ctx.record(**{s.ENGINE_PID.name: pid})
        return {
            s.ENGINE_PID.name: pid,
            s.ENGINE_URL.name: capsule[s.ENGINE_URL.name],
            s.RUNTIME_DIR.name: capsule[s.RUNTIME_DIR.name],
        }
