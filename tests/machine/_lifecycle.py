"""Test doubles for the lifecycle operations (stop, sleep, wake): small specs over the memory
doubles, registered beside the real capture and restore specs, so the Machine's framework is
tested without the drivers' and the engine's own lifecycle specs."""

from __future__ import annotations

from typing import Any

from coldsnap.drivers import n580, n610
from coldsnap.machine import Registry, Spec, Step, StepContext, fact
from coldsnap.machine import steps as s
from coldsnap.testing import (
    MemoryEngine,
    MemoryProcessDriver,
    MemoryTemplateDriver,
    MemoryWorld,
    memory_registry,
)
from coldsnap.testing._doubles import checkpoint_weights

ASLEEP_SINCE = fact("test_asleep_since", "the memory double's sleep marker (tests only)")

STOP_N610 = Spec(
    "stop-n610",
    "stop",
    "n610",
    doc="Stop the restored engine (test double).",
    seeds=(s.ENGINE_PID,),
    steps=[
        Step(
            "stop_engine",
            "driver.stop_engine",
            "stop and reap the engine",
            no_compensation="a stopped engine is not started again",
            on_interrupt="retry",
            needs=(s.ENGINE_PID,),
        )
    ],
)
STOP_N580 = Spec(
    "stop-n580",
    "stop",
    "n580",
    doc="Stop the restored engine (test double).",
    seeds=(s.ENGINE_PID,),
    steps=[STOP_N610.steps[0]],
)
SLEEP = Spec(
    "sleep-sglang",
    "sleep",
    "sglang",
    doc="Release the engine's memory (test double).",
    seeds=(s.ENGINE_PID, s.ENGINE_URL, s.WEIGHT_SOURCE),
    steps=[
        Step(
            "fall_asleep",
            "engine.fall_asleep",
            "release weights and KV",
            compensation="engine.wake_up",
            needs=(s.ENGINE_PID,),
            uses=(s.WEIGHT_SOURCE,),  # its compensation refills from it
            makes=(ASLEEP_SINCE,),
        )
    ],
)
WAKE = Spec(
    "wake-sglang",
    "wake",
    "sglang",
    doc="Give the engine its memory back (test double).",
    seeds=(s.ENGINE_PID, s.WEIGHT_SOURCE),
    steps=[
        Step(
            "wake_up",
            "engine.wake_up",
            "refill the weights from the source",
            no_compensation="an awake engine stays awake",
            needs=(s.ENGINE_PID, s.WEIGHT_SOURCE),
        )
    ],
)


class SleepyEngine(MemoryEngine):
    """The memory engine with sleep and wake steps."""

    def fall_asleep(self, ctx: StepContext) -> dict[str, Any]:
        self._set(ctx, "fall_asleep", weights="asleep", kv="released")
        return {ASLEEP_SINCE.name: 1}

    def wake_up(self, ctx: StepContext) -> None:
        source = ctx.facts[s.WEIGHT_SOURCE.name]
        if "payload_dir" in source:
            weights = self.world.read(source["payload_dir"])["weights"]
        else:
            weights = checkpoint_weights(source["checkpoint"])
        self._set(ctx, "wake_up", weights=weights, kv="resident")


def lifecycle_registry(world: MemoryWorld) -> Registry:
    """memory_registry(world) with stop specs on both drivers and sleep/wake on the engine."""
    registry = memory_registry(world)
    registry.unregister("driver", "n610")
    registry.unregister("driver", "n580")
    registry.unregister("engine", "sglang")
    registry.register_driver(
        "n610",
        capture=n610.CAPTURE,
        restore=n610.RESTORE,
        stop=STOP_N610,
        build=lambda request, engine: MemoryProcessDriver(world, engine.launcher),
        cls=MemoryProcessDriver,
        capabilities={"resumes_process"},
    )
    registry.register_driver(
        "n580",
        capture=n580.CAPTURE,
        restore=n580.RESTORE,
        stop=STOP_N580,
        build=lambda request, engine: MemoryTemplateDriver(world, engine.launcher),
        cls=MemoryTemplateDriver,
    )
    registry.register_engine(
        "sglang",
        build=lambda request: SleepyEngine(world, request.engine),
        sleep=SLEEP,
        wake=WAKE,
        cls=SleepyEngine,
    )
    return registry
