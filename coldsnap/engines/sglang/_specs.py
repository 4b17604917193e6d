"""Sleep and wake, as data: the engine adapter's own operations on a running engine's memory
(they do not depend on how the process was snapshotted, so the engine owns them, not the
driver). Each acts on the engine a finished restore left running (its target) and starts from
the facts seeded from the target's receipt."""

from __future__ import annotations

from coldsnap.machine import Spec, Step, fact
from coldsnap.machine import steps as s

SLEEP_RECORD = fact(
    "sleep_record",
    "what a sleep released: per rank the host bytes returned to the kernel and the device "
    "bytes measured freed, their sums, whether the plugin also exported, and whether health "
    "answered while asleep",
)

_RELEASE = Step(
    "release",
    "engine.sleep_release",
    "release the weights and the KV cache (the server stays up, its health gate closed); every "
    "rank must report this release, and a rank that failed is named",
    compensation="engine.wake_in_place",
    timeout_s=120.0,
    needs=(s.ENGINE_URL, s.RUNTIME_DIR, s.ENGINE_PID),
    uses=(s.CAPSULE, s.WEIGHT_SOURCE),
    makes=(SLEEP_RECORD,),
)

_LEFT_ASLEEP = "engine.sleep_again"

_RESUME_WEIGHTS = Step(
    "resume_weights",
    "engine.resume_weights",
    "write the resume plan from the weight source just verified, and resume the weights "
    "region; the engine refills it before it answers",
    compensation=_LEFT_ASLEEP,
    timeout_s=1800.0,
    needs=(s.ENGINE_URL, s.RUNTIME_DIR, s.WEIGHT_SOURCE),
    uses=(s.CAPSULE, s.ENGINE_PID),
    makes=(s.RESUME_SEED,),
)

_RESUME_REST = Step(
    "resume_rest",
    "engine.resume_rest",
    "resume the kv_cache region (and, where the engine released its CUDA graphs' region, map "
    "it again under the kept graph executables)",
    compensation=_LEFT_ASLEEP,
    timeout_s=300.0,
    needs=(s.ENGINE_URL, s.RUNTIME_DIR, s.ENGINE_PID),
    uses=(s.CAPSULE,),
)

SLEEP = Spec(
    "sleep-sglang",
    "sleep",
    "sglang",
    doc="Release a running engine's weights and KV cache without a snapshot; a failure after "
    "the release resumes them.",
    seeds=(s.ENGINE_PID, s.ENGINE_URL, s.RUNTIME_DIR, s.CAPSULE, s.WEIGHT_SOURCE),
    steps=[s.QUIESCE, _RELEASE],
)

WAKE = Spec(
    "wake-sglang",
    "wake",
    "sglang",
    doc="Give a sleeping engine its weights and KV cache back from the capsule's payload or the "
    "pinned checkpoint, verified again first; a failure leaves the engine asleep.",
    seeds=(
        s.ENGINE_PID,
        s.ENGINE_URL,
        s.ENGINE_LOG,
        s.RUNTIME_DIR,
        s.CAPSULE,
        s.PAYLOAD_DIR,
        s.CAPSULE_CHECKPOINT,
        s.CAPSULE_DRAFT_CHECKPOINT,
    ),
    steps=[
        s.STAGE_PAYLOAD,
        s.VERIFY_CHECKPOINT,
        _RESUME_WEIGHTS,
        _RESUME_REST,
        s.TP_BARRIER,
        s.WAIT_HEALTHY,
    ],
)

__all__ = ["SLEEP", "SLEEP_RECORD", "WAKE"]
