"""Artifacts: what a capture is bound to (identity), whether it fits a runtime
(compatibility), and where its bytes live (a content-addressed store of objects and capsules).
Uses nothing else of coldsnap but the leaves `coldsnap._errors` and `coldsnap._atomic`.

`validate` holds the attrs validators every record uses (here and in coldsnap.providers)."""

from . import _validate as validate
from ._capsule import BLOCK_BYTES, Capsule, Member
from ._collect import (
    capture_identity,
    checkpoint_digests,
    collect_platform,
    file_sha256,
    tree_digest,
)
from ._compat import Difference, check_compatible, diff_identities
from ._convert import converter, from_json, make_converter, record_digest, to_json
from ._errors import (
    ArtifactError,
    IncompatibleArtifact,
    IntegrityError,
    NoCapsule,
    RecordError,
    StoreError,
)
from ._hashing import sha256_fd, sha256_file, sha256_range
from ._identity import (
    EngineBuild,
    FileDigest,
    Identity,
    ModelBinding,
    PhaseCoverage,
    Platform,
    ShapeCoverage,
    SnapshotDriver,
    Topology,
)
from ._names import DIGEST_PREFIX, digest_problem, member_name_problem, tag_problem
from ._nodememo import Stamp, read_record, settled, write_record
from ._store import GcReport, ObjectWriter, Removed, Store, Tally, VerifyReport

__all__ = [
    "BLOCK_BYTES",
    "DIGEST_PREFIX",
    "ArtifactError",
    "Capsule",
    "Difference",
    "EngineBuild",
    "FileDigest",
    "GcReport",
    "Identity",
    "IncompatibleArtifact",
    "IntegrityError",
    "Member",
    "ModelBinding",
    "NoCapsule",
    "ObjectWriter",
    "PhaseCoverage",
    "Platform",
    "RecordError",
    "Removed",
    "ShapeCoverage",
    "SnapshotDriver",
    "Stamp",
    "Store",
    "StoreError",
    "Tally",
    "Topology",
    "VerifyReport",
    "capture_identity",
    "check_compatible",
    "checkpoint_digests",
    "collect_platform",
    "converter",
    "diff_identities",
    "digest_problem",
    "file_sha256",
    "from_json",
    "make_converter",
    "member_name_problem",
    "read_record",
    "record_digest",
    "settled",
    "sha256_fd",
    "sha256_file",
    "sha256_range",
    "tag_problem",
    "to_json",
    "tree_digest",
    "validate",
    "write_record",
]
