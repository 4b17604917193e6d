"""n610's capture and restore, as data. The engine, provider and store steps are the shared ones
(coldsnap.machine.steps); the process and CUDA steps are this driver's."""

from __future__ import annotations

from coldsnap.machine import CUDA, Spec, Step, fact
from coldsnap.machine import steps as s

from .._facts import (
    DISCARD_LAYOUT,
    DUMP_SECONDS,
    ENGINE_START,
    RESTORE_SECONDS,
    RETIRE_SOURCE,
    stop_engine,
)

CUDA_PIDS = fact(
    "cuda_pids", "PIDs of the engine's processes that hold a CUDA context", carried=True
)
RUNTIME_DIR_MADE = fact(
    "runtime_dir_made",
    "whether this restore made the engine's runtime dir (a replica of the same capsule that "
    "serves already has it, and keeps it)",
)

RUNTIME_DIR_AS = fact(
    "runtime_dir_as",
    "the path at which the engine's processes see their runtime dir, which their environment "
    "names (the capsule's): runtime_dir itself, but for a replica, whose own runtime_dir is "
    "bind-mounted there",
)

_FREED_BY_KILL = "the process_restore compensation kills the restored tree, which frees this"

CAPTURE = Spec(
    "capture-n610",
    "capture",
    "n610",
    doc="Snapshot the whole initialized engine process tree and its CUDA state, without weights "
    "and KV cache.",
    steps=[
        s.CHOOSE_WEIGHTS,
        Step(
            "launch_engine",
            "driver.launch_engine",
            "start the engine as a snapshotable process tree",
            compensation="driver.stop_engine",
            timeout_s=120.0,
            needs=(s.WEIGHT_SOURCE,),
            makes=(s.ENGINE_PID, s.ENGINE_URL, s.ENGINE_LOG, s.RUNTIME_DIR, ENGINE_START),
        ),
        s.WAIT_HEALTHY,
        s.RECORD_ACCEPTANCE,
        s.QUIESCE,
        s.RELEASE_MEMORY,
        s.DESTROY_GRAPHS,
        s.EXPORT,
        s.REHEARSE_REFILL,
        Step(
            "cuda_lock",
            "driver.cuda_lock",
            "lock the CUDA driver API of every engine process that holds a context",
            compensation="driver.cuda_unlock",
            when=CUDA,
            needs=(s.ENGINE_PID,),
            makes=(CUDA_PIDS,),
        ),
        Step(
            "cuda_checkpoint",
            "driver.cuda_checkpoint",
            "move each process's device state into host memory",
            compensation="driver.cuda_restore",
            when=CUDA,
            timeout_s=600.0,
            needs=(CUDA_PIDS,),
            uses=(s.ENGINE_PID,),
        ),
        Step(
            "process_dump",
            "driver.dump",
            "dump the process tree with CRIU, leaving it running",
            compensation="driver.discard_dump",
            timeout_s=1800.0,
            needs=(s.ENGINE_PID,),
            makes=(s.IMAGE_DIR, s.IMAGE_BYTES, DUMP_SECONDS),
        ),
        s.SEAL,
        RETIRE_SOURCE,
    ],
)

RESTORE = Spec(
    "restore-n610",
    "restore",
    "n610",
    doc="Restore the process tree at the same virtual addresses, then refill the weights.",
    steps=[
        s.ADMIT,
        s.STAGE_PAYLOAD,
        s.VERIFY_CHECKPOINT,
        Step(
            "process_restore",
            "driver.restore",
            "restore the process tree with CRIU, left stopped",
            compensation="driver.stop_engine",
            timeout_s=600.0,
            needs=(s.IMAGE_DIR, s.CAPSULE),
            makes=(s.ENGINE_PID, s.ENGINE_URL, s.ENGINE_LOG, s.RUNTIME_DIR, RUNTIME_DIR_MADE,
                   RUNTIME_DIR_AS, ENGINE_START, RESTORE_SECONDS, CUDA_PIDS),
        ),
        s.RANKS_PRESENT,
        Step(
            "cuda_restore",
            "driver.cuda_restore",
            "continue the tree and bring back each process's device state (CUDA calls block "
            "until the unlock)",
            no_compensation=_FREED_BY_KILL,
            when=CUDA,
            timeout_s=600.0,
            needs=(s.ENGINE_PID, CUDA_PIDS),
        ),
        Step(
            "cuda_unlock",
            "driver.cuda_unlock",
            "unlock the CUDA driver API",
            no_compensation=_FREED_BY_KILL,
            when=CUDA,
            needs=(CUDA_PIDS,),
        ),
        Step(
            "continue_process",
            "driver.resume_processes",
            "let the restored tree run",
            no_compensation=_FREED_BY_KILL,
            needs=(s.ENGINE_PID,),
        ),
        s.RESUME_WEIGHTS,
        s.RESUME_REST,
        s.TP_BARRIER,
        s.WAIT_HEALTHY,
        s.ACCEPTANCE,
    ],
)

STOP = Spec(
    "stop-n610",
    "stop",
    "n610",
    doc="Stop the engine a restore (or a capture that kept its source) left running, and remove "
    "what it left on the host and in the target's workdir.",
    seeds=(s.ENGINE_PID, s.RUNTIME_DIR, s.CAPSULE, ENGINE_START),
    steps=[stop_engine(s.RUNTIME_DIR, s.CAPSULE, ENGINE_START), DISCARD_LAYOUT],
)
