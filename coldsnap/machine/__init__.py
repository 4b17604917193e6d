"""Capture and restore as declarative state machines: specs, the registry of drivers,
providers, engines and stores, the runner, the journal and receipts."""

from . import _steps as steps
from ._context import Skipped, StepContext
from ._convert import parse_request
from ._diagram import document, mermaid
from ._errors import (
    Cancelled,
    ColdsnapError,
    ComponentError,
    IllegalTransition,
    JournalError,
    MissingFact,
    RegistryError,
    RequestError,
    SpecError,
    StepTimeout,
    UndeclaredFact,
)
from ._facts import Fact, declared_facts, fact
from ._guards import CHECKPOINT, CUDA, GRAPHS, PAYLOAD, RETIRE, Guard, capability
from ._journal import JOURNAL_NAME, Journal, JournalRecord, Replay, read_journal
from ._launch import LaunchCommand, Launcher
from ._machine import Machine
from ._protocols import (
    ArtifactStore,
    Component,
    Driver,
    Engine,
    StepResult,
    WeightProvider,
    check_components,
    declared_methods,
)
from ._receipt import Receipt, StepEvent, StepRecord
from ._registry import ENTRY_POINT_GROUP, REGISTRY, Components, Entry, Registry
from ._requests import CaptureRequest, ModelRef, Request, RestoreRequest
from ._runner import SpecMachine
from ._spec import (
    COMPONENTS,
    SPEC_CHECKS,
    TERMINAL_STATES,
    TRIGGERS,
    Graph,
    Spec,
    Step,
    Transition,
    validate_graph,
)

__all__ = [
    "CHECKPOINT",
    "COMPONENTS",
    "CUDA",
    "ENTRY_POINT_GROUP",
    "GRAPHS",
    "JOURNAL_NAME",
    "PAYLOAD",
    "REGISTRY",
    "RETIRE",
    "SPEC_CHECKS",
    "TERMINAL_STATES",
    "TRIGGERS",
    "ArtifactStore",
    "Cancelled",
    "CaptureRequest",
    "ColdsnapError",
    "Component",
    "ComponentError",
    "Components",
    "Driver",
    "Engine",
    "Entry",
    "Fact",
    "Graph",
    "Guard",
    "IllegalTransition",
    "Journal",
    "JournalError",
    "JournalRecord",
    "LaunchCommand",
    "Launcher",
    "Machine",
    "MissingFact",
    "ModelRef",
    "Receipt",
    "Registry",
    "RegistryError",
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
    "UndeclaredFact",
    "WeightProvider",
    "capability",
    "check_components",
    "declared_facts",
    "declared_methods",
    "document",
    "fact",
    "mermaid",
    "parse_request",
    "read_journal",
    "steps",
    "validate_graph",
]
