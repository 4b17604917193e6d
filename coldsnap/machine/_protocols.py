"""The small interfaces the machines drive. Each step method takes a StepContext and returns
None, a dict of JSON-able facts for later steps and the journal, or `Skipped(reason)`.

Every method named by a spec's steps must exist on the component given to the Machine; the
Machine checks that before the first step, so a missing capability fails before any side effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ._context import Skipped, StepContext
from ._errors import ComponentError
from ._requests import Request
from ._spec import Spec

StepResult = Mapping[str, Any] | Skipped | None


@runtime_checkable
class Driver(Protocol):
    """A snapshot driver (`name` is n580 or n610): process launch, dump, restore, CUDA state."""

    name: str

    def stop_engine(self, ctx: StepContext) -> StepResult: ...


@runtime_checkable
class Engine(Protocol):
    """An engine adapter: the engine's endpoints as steps (health, acceptance, memory, NCCL)."""

    name: str

    def wait_healthy(self, ctx: StepContext) -> StepResult: ...


@runtime_checkable
class WeightProvider(Protocol):
    """Where weights come from on restore (`name` is native or recovery)."""

    name: str

    def stage(self, ctx: StepContext) -> StepResult: ...


@runtime_checkable
class ArtifactStore(Protocol):
    """Seals capsules at capture; admits them (compatibility) at restore."""

    name: str

    def seal(self, ctx: StepContext) -> StepResult: ...

    def admit(self, ctx: StepContext) -> StepResult: ...


def check_components(spec: Spec, request: Request, components: Mapping[str, object]) -> None:
    """Fails closed when a component lacks a method the request's steps call."""
    expected = {"driver": request.driver, "provider": request.provider, "engine": request.engine}
    for role, name in expected.items():
        have = getattr(components[role], "name", None)
        if have != name:
            raise ComponentError(
                f"the request asks for {role} '{name}' but the machine has '{have}'"
            )
    for step in spec.selected(request):
        for action in filter(None, (step.action, step.compensation)):
            role, method = action.split(".", 1)
            if not callable(getattr(components[role], method, None)):
                raise ComponentError(
                    f"{role} '{getattr(components[role], 'name', '?')}' has no method '{method}' "
                    f"needed by step '{step.name}' of {spec.name}"
                )
