"""n580's capture and restore, as data: a context-free template is snapshotted once, and each
restore builds the engine around the weights again."""

from __future__ import annotations

from attrs import evolve

from coldsnap.machine import Spec, Step, fact
from coldsnap.machine import steps as s

from .._facts import (
    DISCARD_LAYOUT,
    DUMP_SECONDS,
    ENGINE_START,
    RESTORE_SECONDS,
    RETIRE_SOURCE,
    stop_engine,
)

TEMPLATE_PID = fact("template_pid", "PID of the template process")
TEMPLATE_ID = fact(
    "template_id", "the template's id: names its control directory", carried=True
)
CONTROL_DIR = fact("control_dir", "directory through which the template is released")
IMPORT_SECONDS = fact("import_seconds", "seconds the template spent importing")
FORKSERVER_ADDRESS = fact(
    "forkserver_address", "socket of the template's warm forkserver", carried=True
)

_RELEASE = Step(
    "release_template",
    "driver.release_template",
    "hand the template the engine's command line; it builds the engine (a restore starts it "
    "from the weight source)",
    compensation="driver.stop_engine",
    timeout_s=120.0,
    needs=(CONTROL_DIR, TEMPLATE_PID, s.WEIGHT_SOURCE),
    makes=(s.ENGINE_PID, s.ENGINE_URL, s.RUNTIME_DIR),
)
_RELEASE_RESTORED = evolve(_RELEASE, uses=(s.CAPSULE,))
"""At restore the release builds as many ranks as the capsule was captured with, and its
compensation finds an unjournaled template by the capsule's template id."""

CAPTURE = Spec(
    "capture-n580",
    "capture",
    "n580",
    doc="Snapshot a context-free template (heavy imports done, no CUDA) and the weight payload.",
    steps=[
        s.CHOOSE_WEIGHTS,
        Step(
            "launch_template",
            "driver.launch_template",
            "start the template process and let it import the heavy modules",
            compensation="driver.stop_template",
            timeout_s=300.0,
            needs=(s.WEIGHT_SOURCE,),
            uses=(s.RUNTIME_DIR,),
            makes=(TEMPLATE_PID, ENGINE_START, TEMPLATE_ID, CONTROL_DIR, s.ENGINE_LOG,
                   IMPORT_SECONDS, FORKSERVER_ADDRESS),
        ),
        Step(
            "check_context_free",
            "driver.check_context_free",
            "refuse a template that maps CUDA or NVIDIA devices",
            side_effect=False,
            on_interrupt="retry",
            needs=(TEMPLATE_PID,),
        ),
        Step(
            "dump_template",
            "driver.dump_template",
            "dump the template with CRIU, leaving it running",
            compensation="driver.discard_template",
            timeout_s=600.0,
            needs=(TEMPLATE_PID,),
            makes=(s.IMAGE_DIR, s.IMAGE_BYTES, DUMP_SECONDS),
        ),
        _RELEASE,
        s.WAIT_HEALTHY,
        s.RECORD_ACCEPTANCE,
        s.RELEASE_MEMORY,
        s.EXPORT,
        s.SEAL,
        evolve(RETIRE_SOURCE, uses=(*RETIRE_SOURCE.uses, CONTROL_DIR)),
    ],
)

RESTORE = Spec(
    "restore-n580",
    "restore",
    "n580",
    doc="Restore the template, then build the engine around the native pack or pinned checkpoint.",
    steps=[
        s.ADMIT,
        s.STAGE_PAYLOAD,
        s.VERIFY_CHECKPOINT,
        Step(
            "restore_template",
            "driver.restore_template",
            "restore the template with CRIU",
            compensation="driver.stop_template",
            timeout_s=300.0,
            needs=(s.IMAGE_DIR, s.CAPSULE),
            uses=(s.RUNTIME_DIR,),
            makes=(TEMPLATE_PID, ENGINE_START, CONTROL_DIR, s.ENGINE_LOG, RESTORE_SECONDS),
        ),
        _RELEASE_RESTORED,
        s.WAIT_HEALTHY,
        s.TP_BARRIER,
        s.ACCEPTANCE,
    ],
)

STOP = Spec(
    "stop-n580",
    "stop",
    "n580",
    doc="Stop the engine a restore (or a capture that kept its source) left running, with the "
    "template's control directory, and remove what it left in the target's workdir.",
    seeds=(s.ENGINE_PID, s.RUNTIME_DIR, s.CAPSULE, TEMPLATE_PID, CONTROL_DIR, ENGINE_START),
    steps=[
        stop_engine(s.RUNTIME_DIR, s.CAPSULE, TEMPLATE_PID, CONTROL_DIR, ENGINE_START),
        DISCARD_LAYOUT,
    ],
)
