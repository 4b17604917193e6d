"""The conformance kit: hypothesis strategies and state machines for drivers, providers and
engines, plus fault injection that needs no cooperation from the component under test.

Tiny test models (`coldsnap.testing.models`) and the CPU support for SGLang
(`coldsnap.testing.sglang_cpu`) live here too but are imported on demand: they pull in heavy
dependencies.
"""

from . import strategies
from ._conformance import MachineConformance, check_receipt, expected_compensations
from ._faults import Abandoned, FaultPlan, InjectedFault, inject_faults

__all__ = [
    "Abandoned",
    "FaultPlan",
    "InjectedFault",
    "MachineConformance",
    "check_receipt",
    "expected_compensations",
    "inject_faults",
    "strategies",
]
