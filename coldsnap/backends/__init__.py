"""Backends: the leaves that snapshot processes (CRIU) and, on GPUs, the CUDA driver's state.

They know nothing of engines, drivers or the machine, and import nothing else of coldsnap but
the leaves `coldsnap._errors` (the root of the exception tree) and `coldsnap._atomic`.
"""

from ._errors import (
    BackendArgumentError,
    BackendError,
    CriuError,
    CriuUnavailable,
    CudaCheckpointError,
    GpuMappingFound,
    LaunchError,
    PidCollision,
    PidStillHeld,
)
from ._probe import gpu_host
from ._records import DumpManifest, RestoredTree, SavedFile
from .criu import RESTORED_PIDFILE, Criu, CriuVersion
from .cuda_checkpoint import CudaCheckpoint
from .launch import Launched, launch
from .procs import (
    GpuMapping,
    become_subreaper,
    check_pids_free,
    gpu_mappings,
    reap,
    reap_children,
    refuse_gpu_mappings,
    running,
    stop_tree,
    wait_gone,
)

__all__ = [
    "RESTORED_PIDFILE",
    "BackendArgumentError",
    "BackendError",
    "Criu",
    "CriuError",
    "CriuUnavailable",
    "CriuVersion",
    "CudaCheckpoint",
    "CudaCheckpointError",
    "DumpManifest",
    "GpuMapping",
    "GpuMappingFound",
    "LaunchError",
    "Launched",
    "PidCollision",
    "PidStillHeld",
    "RestoredTree",
    "SavedFile",
    "become_subreaper",
    "check_pids_free",
    "gpu_host",
    "gpu_mappings",
    "launch",
    "reap",
    "reap_children",
    "refuse_gpu_mappings",
    "running",
    "stop_tree",
    "wait_gone",
]
