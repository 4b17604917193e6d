"""The recovery weight provider: a pinned, verified checkpoint loaded into the model, plus the
residual state (what the checkpoint does not hold) captured as a small native pack."""

from ._checkpoint import PinnedCheckpoint
from ._load import (
    RecoveryReport,
    capture_residual,
    checkpoint_keys,
    load_recovery,
    recovery_tensors,
    residual_names,
    safetensors_keys,
    view_key,
)

__all__ = [
    "PinnedCheckpoint",
    "RecoveryReport",
    "capture_residual",
    "checkpoint_keys",
    "load_recovery",
    "recovery_tensors",
    "residual_names",
    "safetensors_keys",
    "view_key",
]
