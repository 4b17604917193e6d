"""The default components of a Machine: drivers, weight providers, the engine adapter and the
store, wired for a request. Orchestrators may use these or bring their own."""

from ._build import PRELOAD, TOY_POLICY, components
from ._engine import HttpEngine
from ._launchers import RUNTIME_ROOT, SGLangLauncher, ToyLauncher
from ._providers import NativeProvider, RecoveryProvider
from ._store import CaptureRecord, StoreArtifacts

__all__ = [
    "PRELOAD",
    "RUNTIME_ROOT",
    "TOY_POLICY",
    "CaptureRecord",
    "HttpEngine",
    "NativeProvider",
    "RecoveryProvider",
    "SGLangLauncher",
    "StoreArtifacts",
    "ToyLauncher",
    "components",
]
