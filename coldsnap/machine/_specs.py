"""The four operations as data. The step sequences are the contract (docs/state-machines.md)."""

from __future__ import annotations

from ._spec import Spec, Step

_FREED_BY_KILL = "the process_restore compensation kills the restored tree, which frees this"
_READ_ONLY = "reads state only"

# Steps shared by several specs, declared once so that a change reaches every spec.
_WAIT_HEALTHY = Step(
    "wait_healthy",
    "engine.wait_healthy",
    "poll the engine's health until it answers",
    side_effect=False,
    on_interrupt="retry",
    timeout_s=600.0,
)
_RECORD_ACCEPTANCE = Step(
    "acceptance_record",
    "engine.record_acceptance",
    "send the greedy acceptance request; record its tokens for restore to compare",
    side_effect=False,
    on_interrupt="retry",
    timeout_s=120.0,
)
_RELEASE_MEMORY = Step(
    "release_memory",
    "engine.release_memory",
    "release the weights and kv_cache regions (the snapshot must not carry them)",
    compensation="engine.resume_memory",
    timeout_s=120.0,
)
_EXPORT = Step(
    "export_payload",
    "provider.export",
    "write the native weight pack from the final storages",
    compensation="provider.discard_export",
    when="native",
    timeout_s=1800.0,
)
_SEAL = Step(
    "seal_artifact",
    "artifacts.seal",
    "bind identity, add images and packs to the store, publish the capsule atomically",
    compensation="artifacts.unpublish",
    timeout_s=1800.0,
)
_ADMIT = Step(
    "admit",
    "artifacts.admit",
    "load the capsule and check it against this runtime's identity",
    side_effect=False,
    on_interrupt="retry",
)
_STAGE = Step(
    "stage_payload",
    "provider.stage",
    "verify the payload and prepare it for hydration (page cache, pinned or registered memory)",
    compensation="provider.unstage",
    on_interrupt="retry",
    timeout_s=1800.0,
)
_ACCEPTANCE = Step(
    "acceptance",
    "engine.check_acceptance",
    "send the acceptance request; its tokens must equal those recorded at capture",
    side_effect=False,
    on_interrupt="retry",
    timeout_s=120.0,
)

CAPTURE_N610 = Spec(
    "capture-n610",
    "capture",
    "n610",
    doc="Snapshot the whole initialized engine process tree and its CUDA state, without weights "
    "and KV cache.",
    steps=[
        Step(
            "launch_engine",
            "driver.launch_engine",
            "start the engine as a snapshotable process tree",
            compensation="driver.stop_engine",
            timeout_s=120.0,
        ),
        _WAIT_HEALTHY,
        _RECORD_ACCEPTANCE,
        Step(
            "quiesce",
            "engine.quiesce",
            "stop admitting requests and drain the scheduler",
            compensation="engine.unquiesce",
        ),
        _RELEASE_MEMORY,
        Step(
            "destroy_graphs",
            "engine.destroy_graphs",
            "release the cuda_graph region (graphs point into released memory)",
            compensation="engine.recapture_graphs",
            timeout_s=300.0,
        ),
        Step(
            "prepare_nccl",
            "engine.prepare_nccl",
            "tear down communicators' device state so the CUDA checkpoint can proceed",
            compensation="engine.restore_nccl",
        ),
        Step(
            "tp_barrier",
            "engine.tp_barrier",
            "every rank reports the released state before any rank is frozen",
            side_effect=False,
            on_interrupt="retry",
        ),
        _EXPORT,
        Step(
            "cuda_lock",
            "driver.cuda_lock",
            "lock the CUDA driver API of every engine process",
            compensation="driver.cuda_unlock",
        ),
        Step(
            "cuda_checkpoint",
            "driver.cuda_checkpoint",
            "move each process's device state into host memory",
            compensation="driver.cuda_restore",
            timeout_s=600.0,
        ),
        Step(
            "process_dump",
            "driver.dump",
            "dump the process tree with CRIU",
            compensation="driver.discard_dump",
            timeout_s=1800.0,
        ),
        _SEAL,
        Step(
            "retire_source",
            "driver.retire_source",
            "stop and reap the source tree unless the request keeps it",
            no_compensation="the capsule is sealed; the source is no longer needed",
            on_interrupt="retry",
        ),
    ],
)

RESTORE_N610 = Spec(
    "restore-n610",
    "restore",
    "n610",
    doc="Restore the process tree at the same virtual addresses, then refill the weights.",
    steps=[
        _ADMIT,
        _STAGE,
        Step(
            "process_restore",
            "driver.restore",
            "restore the process tree with CRIU, left stopped",
            compensation="driver.stop_engine",
            timeout_s=600.0,
        ),
        Step(
            "cuda_restore",
            "driver.cuda_restore",
            "bring back each process's device state",
            no_compensation=_FREED_BY_KILL,
            timeout_s=600.0,
        ),
        Step(
            "cuda_unlock",
            "driver.cuda_unlock",
            "unlock the CUDA driver API",
            no_compensation=_FREED_BY_KILL,
        ),
        Step(
            "continue_process",
            "driver.resume_processes",
            "let the restored tree run",
            no_compensation=_FREED_BY_KILL,
        ),
        Step(
            "restore_nccl",
            "engine.restore_nccl",
            "rebuild communicators' device state",
            no_compensation=_FREED_BY_KILL,
        ),
        Step(
            "resume_weights",
            "engine.resume_weights",
            "map the weights region back at the same virtual addresses",
            no_compensation=_FREED_BY_KILL,
            timeout_s=120.0,
        ),
        Step(
            "hydrate",
            "provider.hydrate",
            "copy the native pack into the weight storages",
            no_compensation=_FREED_BY_KILL,
            when="native",
            timeout_s=1800.0,
        ),
        Step(
            "load_checkpoint",
            "engine.update_weights_from_disk",
            "load the pinned checkpoint through the engine's own loader",
            no_compensation=_FREED_BY_KILL,
            when="recovery",
            timeout_s=1800.0,
        ),
        Step(
            "resume_rest",
            "engine.resume_rest",
            "resume the kv_cache and cuda_graph regions (the second phase)",
            no_compensation=_FREED_BY_KILL,
            timeout_s=300.0,
        ),
        Step(
            "open_health_gate",
            "engine.open_health_gate",
            "let health and traffic through now that weights are in place",
            compensation="engine.close_health_gate",
        ),
        _ACCEPTANCE,
    ],
)

CAPTURE_N580 = Spec(
    "capture-n580",
    "capture",
    "n580",
    doc="Snapshot a context-free template (heavy imports done, no CUDA) and the weight payload.",
    steps=[
        Step(
            "launch_template",
            "driver.launch_template",
            "start the template process and let it import the heavy modules",
            compensation="driver.stop_template",
            timeout_s=300.0,
        ),
        Step(
            "check_context_free",
            "driver.check_context_free",
            "refuse a template that maps CUDA or NVIDIA devices",
            side_effect=False,
            on_interrupt="retry",
        ),
        Step(
            "dump_template",
            "driver.dump_template",
            "dump the template with CRIU, leaving it running",
            compensation="driver.discard_template",
            timeout_s=600.0,
        ),
        Step(
            "release_template",
            "driver.release_template",
            "hand the template the engine arguments and the provider selection",
            compensation="driver.stop_engine",
        ),
        _WAIT_HEALTHY,
        _RECORD_ACCEPTANCE,
        _RELEASE_MEMORY,
        _EXPORT,
        _SEAL,
        Step(
            "retire_source",
            "driver.retire_source",
            "stop the engine built from the template unless the request keeps it",
            no_compensation="the capsule is sealed; the source is no longer needed",
            on_interrupt="retry",
        ),
    ],
)

RESTORE_N580 = Spec(
    "restore-n580",
    "restore",
    "n580",
    doc="Restore the template, then build the engine around the native pack or pinned checkpoint.",
    steps=[
        _ADMIT,
        _STAGE,
        Step(
            "restore_template",
            "driver.restore_template",
            "restore the template with CRIU",
            compensation="driver.stop_template",
            timeout_s=300.0,
        ),
        Step(
            "release_template",
            "driver.release_template",
            "hand the template the engine arguments and the provider selection",
            compensation="driver.stop_engine",
        ),
        Step(
            "construct_engine",
            "driver.construct_engine",
            "the engine allocates without loading and hydrates (native) or loads the pinned "
            "checkpoint (recovery)",
            side_effect=False,
            on_interrupt="retry",
            timeout_s=1800.0,
        ),
        _WAIT_HEALTHY,
        _ACCEPTANCE,
    ],
)

SPECS: dict[str, Spec] = {
    spec.name: spec for spec in (CAPTURE_N610, RESTORE_N610, CAPTURE_N580, RESTORE_N580)
}


def spec_for(operation: str, driver: str) -> Spec:
    """The spec of an operation for a driver; a KeyError names what exists."""
    name = f"{operation}-{driver}"
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"no spec '{name}' (known: {', '.join(sorted(SPECS))})") from None
