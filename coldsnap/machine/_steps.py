"""The shared vocabulary of the specs: the facts several roles exchange, and the steps of the
engine, provider and store roles that every driver's specs use. Drivers declare their own facts
and steps beside their specs and import these.
"""

from __future__ import annotations

from ._facts import fact
from ._guards import CHECKPOINT, GRAPHS, PAYLOAD, Guard, capability
from ._spec import Step

RANKS = Guard(
    "ranks",
    "the engine reports each of its tensor-parallel ranks, so the machine counts them",
    capability("engine", "rank_reports"),
)

# -- facts the driver makes and the engine steps need -------------------------------------------
ENGINE_PID = fact("engine_pid", "PID of the engine's root process (its tree is the engine)")
ENGINE_URL = fact("engine_url", "base URL the engine serves on", carried=True)
ENGINE_LOG = fact("engine_log", "file the engine's stdout and stderr go to")
RUNTIME_DIR = fact(
    "runtime_dir",
    "the engine's runtime directory: the plugin's status files and the resume plan",
    carried=True,
)
IMAGE_DIR = fact("image_dir", "directory holding the process image (CRIU) of this operation")
IMAGE_BYTES = fact("image_bytes", "size of the process image", carried=True)

# -- facts of the engine steps ------------------------------------------------------------------
HEALTHY_AFTER_S = fact("healthy_after_s", "seconds the engine took to answer as ready")
ACCEPTANCE_TOKENS = fact(
    "acceptance_tokens", "token ids of the greedy acceptance request", carried=True
)
EXPORT_DIR = fact("export_dir", "where the engine writes its weight payload on release")
RESUME_SEED = fact("resume_seed", "the sampling seed every rank took on resume")
TP_SIZE = fact(
    "tp_size",
    "tensor-parallel ranks of the engine, counted from the ranks' own reports of the release",
    carried=True,
)
RANK_PIDS = fact(
    "rank_pids",
    "process name -> pid of each rank at the release (an n610 restore brings them back as they "
    "were)",
    carried=True,
)
TP_RANKS = fact(
    "tp_ranks",
    "per rank of the restored engine: its pid and the last operation it reported",
)
SHAPE_COVERAGE = fact(
    "shape_coverage",
    "the graph shapes the engine warmed before the snapshot, per phase, as its ranks published "
    "them (None where none was published); the capsule's identity binds it",
)
RESIDUAL_DEVICE_BYTES = fact(
    "residual_device_bytes",
    "device memory still in use after the release, summed over the engine's ranks (0 on CPU)",
)

# -- facts of the provider steps ----------------------------------------------------------------
PAYLOAD_DIR = fact("payload_dir", "root of the weight payload (one pack per rank and role)")
PAYLOAD_BYTES = fact("payload_bytes", "size of the exported weight payload")
PACKS = fact("packs", "number of packs in the payload")
VERIFY_SECONDS = fact("verify_seconds", "seconds spent verifying the payload's checksums")
CHECKPOINT_FILES = fact("checkpoint_files", "number of files of the pinned checkpoint checked")
WEIGHT_SOURCE = fact(
    "weight_source",
    "what the engine starts with, as the provider chose it (coldsnap.machine.WeightSource): a "
    "payload (exported on release at capture; payload_dir and preverified at restore) or a "
    "checkpoint (with its draft_checkpoint)",
)

# -- facts of the store steps -------------------------------------------------------------------
VERIFY_IMAGE_SECONDS = fact(
    "verify_image_seconds", "seconds admit spent verifying every block of the process image"
)
CAPSULE_DIGEST = fact("capsule_digest", "sha256 digest of the sealed or admitted capsule")
CAPSULE_CREATED = fact("capsule_created", "whether this capture created the capsule")
CAPSULE_TAG_WAS = fact("capsule_tag_was", "what the capture's tag pointed to before the seal")
CAPSULE_BYTES = fact("capsule_bytes", "size of the capsule's members")
CAPSULE = fact("capsule", "the carried facts of the capture, read back from the capsule")
CAPSULE_CHECKPOINT = fact(
    "capsule_checkpoint", "file name -> sha256 of the checkpoint the capsule is bound to"
)
CAPSULE_DRAFT_CHECKPOINT = fact(
    "capsule_draft_checkpoint",
    "file name -> sha256 of the speculative draft model's checkpoint the capsule is bound to "
    "(empty when it serves without a draft)",
)

# -- steps shared by several specs --------------------------------------------------------------
CHOOSE_WEIGHTS = Step(
    "choose_weights",
    "provider.launch_weights",
    "the provider says what the engine starts with: a payload it exports on release, or the "
    "model's checkpoint (the driver hands it to the engine's launcher)",
    side_effect=False,
    on_interrupt="retry",
    makes=(WEIGHT_SOURCE,),
)
WAIT_HEALTHY = Step(
    "wait_healthy",
    "engine.wait_healthy",
    "poll the engine's readiness until it answers (and fail at once if its process ends)",
    side_effect=False,
    on_interrupt="retry",
    timeout_s=600.0,
    needs=(ENGINE_URL, ENGINE_PID),
    uses=(RUNTIME_DIR, ENGINE_LOG),
    makes=(HEALTHY_AFTER_S,),
)
RECORD_ACCEPTANCE = Step(
    "acceptance_record",
    "engine.record_acceptance",
    "send the greedy acceptance request; record its tokens for restore to compare",
    side_effect=False,
    on_interrupt="retry",
    timeout_s=120.0,
    needs=(ENGINE_URL,),
    uses=(ENGINE_PID,),
    makes=(ACCEPTANCE_TOKENS,),
)
QUIESCE = Step(
    "quiesce",
    "engine.quiesce",
    "flush the prefix cache, which the engine refuses while any request runs: the snapshot then "
    "holds no request and no cached prefix",
    no_compensation="a flushed prefix cache refills by itself",
    needs=(ENGINE_URL,),
    uses=(ENGINE_PID,),
)
RELEASE_MEMORY = Step(
    "release_memory",
    "engine.release_memory",
    "release the weights and kv_cache regions (the snapshot must not carry them); an engine "
    "started to export writes its payload first",
    compensation="engine.resume_memory",
    timeout_s=120.0,
    needs=(ENGINE_URL, RUNTIME_DIR, ENGINE_PID),
    makes=(EXPORT_DIR, RESIDUAL_DEVICE_BYTES, TP_SIZE, RANK_PIDS, SHAPE_COVERAGE),
)
DESTROY_GRAPHS = Step(
    "destroy_graphs",
    "engine.destroy_graphs",
    "release the CUDA graphs' memory region: its pages leave the device and the image, the "
    "graph executables stay (their addresses kept for the resume) and nothing is recaptured; "
    "each rank must have freed device memory by it",
    compensation="engine.recapture_graphs",
    when=GRAPHS,
    timeout_s=300.0,
    needs=(ENGINE_URL, RUNTIME_DIR),
    uses=(ENGINE_PID,),
)
EXPORT = Step(
    "export_payload",
    "provider.export",
    "find and size the weight pack the engine exported from its final storages",
    compensation="provider.discard_export",
    when=PAYLOAD,
    timeout_s=1800.0,
    needs=(EXPORT_DIR,),
    makes=(PAYLOAD_DIR, PAYLOAD_BYTES, PACKS),
)
REHEARSE_REFILL = Step(
    "rehearse_refill",
    "engine.rehearse_refill",
    "before anything is dumped or sealed: resume the released engine through the resume plan a "
    "restore of this capsule sends (the payload just exported, verified as it is read, or the "
    "model's checkpoint), ask the acceptance request from an empty prefix cache and compare it "
    "with the recorded answer, then release again (a refilled engine exports nothing); a "
    "difference refuses the capture, since every restore would answer otherwise",
    no_compensation="the step releases again what it resumed, also when the answers differ, "
    "and release_memory's compensation resumes whatever is released from the model's checkpoint",
    timeout_s=1800.0,
    needs=(ENGINE_URL, RUNTIME_DIR, ENGINE_PID, ACCEPTANCE_TOKENS, WEIGHT_SOURCE),
    uses=(PAYLOAD_DIR,),
)
SEAL = Step(
    "seal_artifact",
    "artifacts.seal",
    "bind identity, add images, payload and carried facts to the store, publish atomically",
    compensation="artifacts.unpublish",
    timeout_s=1800.0,
    needs=(IMAGE_DIR,),
    uses=(PAYLOAD_DIR, SHAPE_COVERAGE),
    makes=(CAPSULE_DIGEST, CAPSULE_CREATED, CAPSULE_TAG_WAS, CAPSULE_BYTES),
)
ADMIT = Step(
    "admit",
    "artifacts.admit",
    "load the capsule, check it against this runtime's identity, lay its files out",
    compensation="artifacts.discard_layout",
    on_interrupt="retry",
    makes=(
        CAPSULE_DIGEST,
        CAPSULE,
        IMAGE_DIR,
        CAPSULE_CHECKPOINT,
        CAPSULE_DRAFT_CHECKPOINT,
        PAYLOAD_DIR,
        VERIFY_IMAGE_SECONDS,
    ),
)
STAGE_PAYLOAD = Step(
    "stage_payload",
    "provider.stage",
    "verify every block of the payload (which also pulls it into the page cache)",
    side_effect=False,
    when=PAYLOAD,
    on_interrupt="retry",
    timeout_s=1800.0,
    needs=(PAYLOAD_DIR,),
    makes=(WEIGHT_SOURCE, VERIFY_SECONDS),
)
VERIFY_CHECKPOINT = Step(
    "verify_checkpoint",
    "provider.stage",
    "check that the checkpoint's files are those the capsule is bound to",
    side_effect=False,
    when=CHECKPOINT,
    on_interrupt="retry",
    needs=(CAPSULE_CHECKPOINT,),
    uses=(CAPSULE_DRAFT_CHECKPOINT,),
    makes=(WEIGHT_SOURCE, CHECKPOINT_FILES),
)
RESUME_WEIGHTS = Step(
    "resume_weights",
    "engine.resume_weights",
    "hand the engine its weight source and resume the weights region; the engine refills it "
    "(payload or checkpoint) before it answers",
    no_compensation="the driver's restore compensation stops the restored engine",
    timeout_s=1800.0,
    needs=(ENGINE_URL, RUNTIME_DIR, WEIGHT_SOURCE),
    uses=(ENGINE_PID, CAPSULE),
    makes=(RESUME_SEED,),
)
RESUME_REST = Step(
    "resume_rest",
    "engine.resume_rest",
    "resume the kv_cache region (and, where the engine released its CUDA graphs' region, map "
    "it again under the kept graph executables)",
    no_compensation="the driver's restore compensation stops the restored engine",
    timeout_s=300.0,
    needs=(ENGINE_URL,),
    uses=(ENGINE_PID, RUNTIME_DIR, CAPSULE),
)
RANKS_PRESENT = Step(
    "ranks_present",
    "engine.check_ranks",
    "before the restored tree runs: every rank the capsule was captured with is back, a live "
    "process of this engine at its captured pid (a rank lost at restore is named, and the tree "
    "never runs without it)",
    side_effect=False,
    when=RANKS,
    on_interrupt="retry",
    needs=(ENGINE_PID, CAPSULE),
)
TP_BARRIER = Step(
    "tp_barrier",
    "engine.tp_barrier",
    "read what every rank reported: each one running, all at the same last operation, each "
    "one ok with nothing left released (and hydrated, for an engine built from a payload); "
    "names every rank that is missing, failed or ended",
    side_effect=False,
    when=RANKS,
    on_interrupt="retry",
    needs=(RUNTIME_DIR, ENGINE_PID, CAPSULE, WEIGHT_SOURCE),
    makes=(TP_RANKS,),
)
ACCEPTANCE = Step(
    "acceptance",
    "engine.check_acceptance",
    "send the acceptance request; its tokens must equal those recorded at capture",
    side_effect=False,
    on_interrupt="retry",
    timeout_s=120.0,
    needs=(ENGINE_URL, CAPSULE),
    uses=(ENGINE_PID,),
    makes=(ACCEPTANCE_TOKENS,),
)
