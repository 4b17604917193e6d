"""Capture and restore as declarative state machines: specs, runner, journal, receipts."""

from ._context import Skipped, StepContext
from ._convert import parse_request
from ._diagram import document, mermaid
from ._errors import (
    Cancelled,
    ColdsnapError,
    ComponentError,
    IllegalTransition,
    JournalError,
    RequestError,
    SpecError,
    StepTimeout,
)
from ._host import HostOps, LocalHost
from ._journal import JOURNAL_NAME, Journal, JournalRecord, Replay, read_journal
from ._machine import Machine
from ._protocols import ArtifactStore, Driver, Engine, StepResult, WeightProvider
from ._receipt import Receipt, StepEvent, StepRecord
from ._requests import DRIVERS, PROVIDERS, CaptureRequest, ModelRef, Request, RestoreRequest
from ._runner import SpecMachine
from ._spec import (
    COMPONENTS,
    GUARDS,
    TERMINAL_STATES,
    TRIGGERS,
    Graph,
    Spec,
    Step,
    Transition,
    validate_graph,
    validate_steps,
)
from ._specs import CAPTURE_N580, CAPTURE_N610, RESTORE_N580, RESTORE_N610, SPECS, spec_for

__all__ = [
    "CAPTURE_N580",
    "CAPTURE_N610",
    "COMPONENTS",
    "DRIVERS",
    "GUARDS",
    "JOURNAL_NAME",
    "PROVIDERS",
    "RESTORE_N580",
    "RESTORE_N610",
    "SPECS",
    "TERMINAL_STATES",
    "TRIGGERS",
    "ArtifactStore",
    "Cancelled",
    "CaptureRequest",
    "ColdsnapError",
    "ComponentError",
    "Driver",
    "Engine",
    "Graph",
    "HostOps",
    "IllegalTransition",
    "Journal",
    "JournalError",
    "JournalRecord",
    "LocalHost",
    "Machine",
    "ModelRef",
    "Receipt",
    "Replay",
    "Request",
    "RequestError",
    "RestoreRequest",
    "Skipped",
    "Spec",
    "SpecError",
    "SpecMachine",
    "Step",
    "StepContext",
    "StepEvent",
    "StepRecord",
    "StepResult",
    "StepTimeout",
    "Transition",
    "WeightProvider",
    "document",
    "mermaid",
    "parse_request",
    "read_journal",
    "spec_for",
    "validate_graph",
    "validate_steps",
]
