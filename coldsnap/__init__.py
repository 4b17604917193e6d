"""coldsnap: snapshot an initialized inference server, restore it in seconds.

The public API is the Machine and its requests, receipts and errors; everything else is reached
through its own package (drivers, providers, artifacts, engines, plugin, testing). The names are
loaded on first use, so code that runs inside an engine's processes and imports only
`coldsnap.providers` or `coldsnap.plugin` does not pay for the machines.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "BRANCHES",
    "REGISTRY",
    "Cancelled",
    "CaptureRequest",
    "ColdsnapError",
    "ComponentError",
    "Components",
    "DefinitionError",
    "EnvironmentMissing",
    "ErrorRecord",
    "Fact",
    "Guard",
    "IllegalTransition",
    "JournalError",
    "Machine",
    "ModelRef",
    "OperationError",
    "PluginError",
    "Receipt",
    "RefusedError",
    "Registry",
    "RegistryError",
    "RequestError",
    "RestoreRequest",
    "Skipped",
    "SleepRequest",
    "Spec",
    "SpecError",
    "Step",
    "StepContext",
    "StepEvent",
    "StepTimeout",
    "StopRequest",
    "WakeRequest",
    "__version__",
    "branch_of",
    "fact",
    "parse_request",
]  # fmt: skip
"""The branches of the exception tree (DefinitionError, RequestError, OperationError,
RefusedError, PluginError; `BRANCHES`, `branch_of`) are public: a receipt's `failure` names the
branch of the error that ended its operation (ErrorRecord)."""

if TYPE_CHECKING:
    from coldsnap.machine import (
        BRANCHES,
        REGISTRY,
        Cancelled,
        CaptureRequest,
        ColdsnapError,
        ComponentError,
        Components,
        DefinitionError,
        EnvironmentMissing,
        ErrorRecord,
        Fact,
        Guard,
        IllegalTransition,
        JournalError,
        Machine,
        ModelRef,
        OperationError,
        PluginError,
        Receipt,
        RefusedError,
        Registry,
        RegistryError,
        RequestError,
        RestoreRequest,
        Skipped,
        SleepRequest,
        Spec,
        SpecError,
        Step,
        StepContext,
        StepEvent,
        StepTimeout,
        StopRequest,
        WakeRequest,
        branch_of,
        fact,
        parse_request,
    )


def __getattr__(name: str) -> Any:
    if name in __all__ and name != "__version__":
        return getattr(importlib.import_module("coldsnap.machine"), name)
    raise AttributeError(f"module 'coldsnap' has no attribute {name!r}")
