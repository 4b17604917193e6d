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
    "REGISTRY", "Cancelled", "CaptureRequest", "ColdsnapError", "ComponentError", "Components",
    "Fact", "Guard", "IllegalTransition", "JournalError", "Machine", "ModelRef", "Receipt",
    "Registry", "RegistryError", "RequestError", "RestoreRequest", "Skipped", "Spec",
    "SpecError", "Step", "StepContext", "StepEvent", "StepTimeout", "__version__", "fact",
    "parse_request",
]  # fmt: skip

if TYPE_CHECKING:
    from coldsnap.machine import (
        REGISTRY,
        Cancelled,
        CaptureRequest,
        ColdsnapError,
        ComponentError,
        Components,
        Fact,
        Guard,
        IllegalTransition,
        JournalError,
        Machine,
        ModelRef,
        Receipt,
        Registry,
        RegistryError,
        RequestError,
        RestoreRequest,
        Skipped,
        Spec,
        SpecError,
        Step,
        StepContext,
        StepEvent,
        StepTimeout,
        fact,
        parse_request,
    )


def __getattr__(name: str) -> Any:
    if name in __all__ and name != "__version__":
        return getattr(importlib.import_module("coldsnap.machine"), name)
    raise AttributeError(f"module 'coldsnap' has no attribute {name!r}")
