"""Facts and steps both drivers have (their own live beside their specs)."""

from __future__ import annotations

from coldsnap.machine import RETIRE, Step, fact
from coldsnap.machine import steps as s

DUMP_SECONDS = fact("dump_seconds", "seconds CRIU took to dump")
RESTORE_SECONDS = fact("restore_seconds", "seconds CRIU took to restore")

RETIRE_SOURCE = Step(
    "retire_source",
    "driver.retire_source",
    "stop and reap the source engine's tree",
    no_compensation="the capsule is sealed; the source is no longer needed",
    when=RETIRE,
    on_interrupt="retry",
    needs=(s.ENGINE_PID,),
)
