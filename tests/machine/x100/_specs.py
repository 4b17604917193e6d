"""x100's capture and restore, as data: the shared engine, provider and store steps of
coldsnap.machine.steps around the driver's own steps and facts."""

from __future__ import annotations

from coldsnap.machine import RETIRE, Spec, Step, fact
from coldsnap.machine import steps as s

SLOT = fact("x100_slot", "the slot the parked engine's process lies in", carried=True)
PARK_SECONDS = fact("x100_park_seconds", "seconds the park took")

START = Step(
    "start_engine",
    "driver.start_engine",
    "start the engine",
    compensation="driver.stop_engine",
    needs=(s.WEIGHT_SOURCE,),
    makes=(s.ENGINE_PID, s.ENGINE_URL, s.ENGINE_LOG, s.RUNTIME_DIR),
)
PARK = Step(
    "park",
    "driver.park",
    "copy the released engine's process into a slot, leaving it running",
    compensation="driver.unpark_slot",
    needs=(s.ENGINE_PID,),
    makes=(s.IMAGE_DIR, s.IMAGE_BYTES, SLOT, PARK_SECONDS),
)
UNPARK = Step(
    "unpark",
    "driver.unpark",
    "start the parked process again from the capsule's image",
    compensation="driver.stop_engine",
    needs=(s.IMAGE_DIR, s.CAPSULE),
    makes=(s.ENGINE_PID, s.ENGINE_URL, s.ENGINE_LOG, s.RUNTIME_DIR),
)

CAPTURE = Spec(
    "capture-x100",
    "capture",
    "x100",
    doc="Park the released engine.",
    steps=[
        s.CHOOSE_WEIGHTS,
        START,
        s.WAIT_HEALTHY,
        s.RECORD_ACCEPTANCE,
        s.QUIESCE,
        s.RELEASE_MEMORY,
        s.DESTROY_GRAPHS,
        s.EXPORT,
        PARK,
        s.SEAL,
        Step(
            "retire_source",
            "driver.stop_engine",
            "stop the source engine",
            no_compensation="the capsule is sealed; the source is no longer needed",
            when=RETIRE,
            on_interrupt="retry",
            needs=(s.ENGINE_PID,),
        ),
    ],
)

RESTORE = Spec(
    "restore-x100",
    "restore",
    "x100",
    doc="Unpark the engine and refill its weights.",
    steps=[
        s.ADMIT,
        s.STAGE_PAYLOAD,
        s.VERIFY_CHECKPOINT,
        UNPARK,
        s.RESUME_WEIGHTS,
        s.RESUME_REST,
        s.WAIT_HEALTHY,
        s.ACCEPTANCE,
    ],
)

STOP = Spec(
    "stop-x100",
    "stop",
    "x100",
    doc="Stop the unparked engine.",
    seeds=(s.ENGINE_PID,),
    steps=[
        Step(
            "stop_engine",
            "driver.stop_engine",
            "stop the engine",
            no_compensation="a stopped engine is not started again",
            on_interrupt="retry",
            needs=(s.ENGINE_PID,),
        )
    ],
)
