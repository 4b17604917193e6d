"""Facts and steps both drivers have (their own live beside their specs)."""

from __future__ import annotations

from coldsnap.machine import RETIRE, Fact, Step, fact
from coldsnap.machine import steps as s

DUMP_SECONDS = fact("dump_seconds", "seconds CRIU took to dump")
RESTORE_SECONDS = fact("restore_seconds", "seconds CRIU took to restore")
ENGINE_START = fact(
    "engine_start",
    "start stamp of the engine's root process (boot id and start time): what tells it apart "
    "from a replica restored from the same image, which has its PID and environment",
)

RETIRE_SOURCE = Step(
    "retire_source",
    "driver.retire_source",
    "stop and reap the source engine's tree",
    no_compensation="the capsule is sealed; the source is no longer needed",
    when=RETIRE,
    on_interrupt="retry",
    needs=(s.ENGINE_PID,),
    uses=(s.RUNTIME_DIR,),
)


def stop_engine(*uses: Fact) -> Step:
    """The stop operation's step of a driver that reads `uses` (beside the engine's pid) to
    find what it must remove."""
    return Step(
        "stop_engine",
        "driver.stop_engine",
        "stop the engine's whole process tree (a PID another process took since, a replica "
        "restored from the same image included, is not signalled), then remove its runtime dir "
        "(and an n580 template's control dir) unless another live process uses it, and CRIU's "
        "restore work dir in the target's workdir",
        no_compensation="stopping is what was asked; a restore brings the engine back",
        on_interrupt="retry",
        timeout_s=120.0,
        needs=(s.ENGINE_PID,),
        uses=uses,
    )


DISCARD_LAYOUT = Step(
    "discard_layout",
    "artifacts.discard_layout",
    "remove the capsule's files admit laid out in the target's workdir: hard links that would "
    "keep the store's bytes after its gc",
    no_compensation="the store keeps the capsule; a restore lays its files out again",
    on_interrupt="retry",
)
