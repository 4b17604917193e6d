"""coldsnap: snapshot an initialized inference server, restore it in seconds.

The public API is the Machine and its requests, receipts and errors; everything else is reached
through its own package (drivers, providers, artifacts, engines, plugin, testing).
"""

from coldsnap.machine import (
    Cancelled,
    CaptureRequest,
    ColdsnapError,
    ComponentError,
    IllegalTransition,
    JournalError,
    Machine,
    ModelRef,
    Receipt,
    RequestError,
    RestoreRequest,
    Skipped,
    SpecError,
    StepContext,
    StepEvent,
    StepTimeout,
    parse_request,
)

__version__ = "0.1.0"

__all__ = [
    "Cancelled",
    "CaptureRequest",
    "ColdsnapError",
    "ComponentError",
    "IllegalTransition",
    "JournalError",
    "Machine",
    "ModelRef",
    "Receipt",
    "RequestError",
    "RestoreRequest",
    "Skipped",
    "SpecError",
    "StepContext",
    "StepEvent",
    "StepTimeout",
    "__version__",
    "parse_request",
]
