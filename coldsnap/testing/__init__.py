"""The conformance kit: hypothesis strategies and state machines for drivers, providers and
engines, fault injection that needs no cooperation from the component under test, and in-memory
doubles of the four roles registered with the real specs (`memory_registry`).

The toy engine's registration (`coldsnap.testing.toy`) and the real SGLang test server
(`coldsnap.testing.sglang_cpu`) live here too but are imported on demand: they pull in heavy
dependencies. Tiny random models are the product's (`coldsnap.tiny_models`: the demo builds one).
The product never imports this package.
"""

from . import strategies
from ._conformance import MachineConformance, check_receipt, expected_compensations
from ._doubles import (
    PROVIDER_CAPABILITIES,
    MemoryEngine,
    MemoryLauncher,
    MemoryProcessDriver,
    MemoryProvider,
    MemoryStore,
    MemoryTemplateDriver,
    MemoryWorld,
    memory_components,
    memory_registry,
    register_memory,
)
from ._faults import Abandoned, FaultPlan, InjectedFault, inject_faults

__all__ = [
    "PROVIDER_CAPABILITIES",
    "Abandoned",
    "FaultPlan",
    "InjectedFault",
    "MachineConformance",
    "MemoryEngine",
    "MemoryLauncher",
    "MemoryProcessDriver",
    "MemoryProvider",
    "MemoryStore",
    "MemoryTemplateDriver",
    "MemoryWorld",
    "check_receipt",
    "expected_compensations",
    "inject_faults",
    "memory_components",
    "memory_registry",
    "register_memory",
    "strategies",
]
