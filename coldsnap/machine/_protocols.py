"""The roles a Machine drives, as typed protocols: what each spec's steps may call.

Every step method takes a StepContext and returns None, a mapping of the facts it declares it
makes (JSON-able; the runner refuses others), or `Skipped(reason)` for a third party's step that
had nothing to do. Each method is idempotent: a resumed machine may call it again, and a
compensation may run after its step failed half-way (`ctx.compensating` is then true).

Drivers own their specs, so the driver protocol holds only what the Machine itself calls; the
registry checks a driver's class against the methods its specs name. The engine, provider and
store protocols hold every method the shared steps (coldsnap.machine._steps) name; spec
registration refuses an action that is not declared here.

A role's protocol holds what every component of the role has; what only a capability brings
is its own protocol (CAPABILITY_PROTOCOLS: a payload provider's export, an engine's CUDA graph
and rank steps), so a component without the capability carries no method that only raises,
and one that declares the capability must have its methods (check_components).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._context import Skipped, StepContext
from ._errors import ComponentError
from ._launch import InstalledBuild, Launcher, LaunchLine
from ._spec import Spec

if TYPE_CHECKING:
    from ._requests import Request

StepResult = Mapping[str, Any] | Skipped | None


@runtime_checkable
class Component(Protocol):
    """What every role has: the name a request selects it by, and what it can do (guards read
    `capabilities`, never names)."""

    name: str
    capabilities: frozenset[str]


@runtime_checkable
class Driver(Component, Protocol):
    """A snapshot driver: process launch, dump, restore and CUDA state, through its own specs."""

    def stop_engine(self, ctx: StepContext) -> StepResult:
        """Stops and reaps whatever engine or template the operation started or restored."""
        ...


@runtime_checkable
class Engine(Component, Protocol):
    """An engine adapter: the engine's endpoints as steps. Capabilities: `cuda_graphs`
    (GraphEngine), `rank_reports` (RankedEngine).

    `launcher` hands drivers the engine's command line; `build()` names the engine installed
    here (an InstalledBuild, by value), which the store binds into capsules. The engine owns
    its launch-line policy: the command line reads a user's launch line through
    `parse_command_line`, and the store compares engine arguments through
    `engine_args_differences`. The registry checks a request against that policy before
    building anything, on the registered class: `check_engine_args` and
    `check_engine_options` are static (building an adapter imports its engine)."""

    launcher: Launcher

    @staticmethod
    def check_engine_args(args: Sequence[str]) -> list[tuple[str, str]]:
        """(field, why) for each of a request's engine arguments coldsnap cannot pass on (a
        flag it sets itself, takes from another request field, or cannot honour); the field
        is `engine_args`."""
        ...

    @staticmethod
    def check_engine_options(options: Mapping[str, str]) -> list[tuple[str, str]]:
        """(field, why) for each of a request's engine options this engine does not know or
        cannot take; the field is `engine_options.<key>`."""
        ...

    def build(self, recorded: InstalledBuild | None = None) -> InstalledBuild:
        """The engine installed here: name, version, contract and plugin digests, variants and
        (where the engine records them) the digests of the files those are read from.

        None: taken from the engine itself (a capture's seal; it may import the engine).
        `recorded`: a capsule's build, passed only where it records `sources`; returned when
        the install here is the one it was taken from, checked by those files without
        importing the engine, else IncompatibleArtifact naming each changed field or file."""
        ...

    def parse_command_line(self, argv: Sequence[str]) -> LaunchLine:
        """A user's launch command line as a capture request's fields (CommandLineError)."""
        ...

    def engine_args_differences(
        self, captured: Sequence[str], requested: Sequence[str]
    ) -> list[Any]:
        """One store Difference per engine-changing argument a restore would change."""
        ...

    def engine_options_differences(
        self, captured: Mapping[str, str], requested: Mapping[str, str]
    ) -> list[Any]:
        """One store Difference (`engine_options.<key>`) per bound option a restore would
        change."""
        ...

    def wait_healthy(self, ctx: StepContext) -> StepResult:
        """Polls readiness until it answers; fails at once if the engine's process ends."""
        ...

    def record_acceptance(self, ctx: StepContext) -> StepResult:
        """Makes `acceptance_tokens` from a greedy request (capture)."""
        ...

    def check_acceptance(self, ctx: StepContext) -> StepResult:
        """Raises unless the greedy request answers the capsule's `acceptance_tokens`."""
        ...

    def quiesce(self, ctx: StepContext) -> StepResult:
        """Flushes caches, failing while a request runs, so the snapshot holds no request."""
        ...

    def release_memory(self, ctx: StepContext) -> StepResult:
        """Releases weights and KV (the engine exports its payload first when started to)."""
        ...

    def resume_memory(self, ctx: StepContext) -> StepResult:
        """Undoes release at capture: the weights come back from the model's checkpoint."""
        ...

    def rehearse_refill(self, ctx: StepContext) -> StepResult:
        """At capture, once released and exported: resumes the engine as a restore would refill
        it, raises unless it gives the recorded acceptance answer, and releases again."""
        ...

    def resume_weights(self, ctx: StepContext) -> StepResult:
        """Hands the engine `weight_source` and resumes the weights; returns once refilled."""
        ...

    def resume_rest(self, ctx: StepContext) -> StepResult:
        """Resumes everything else released at capture."""
        ...


@runtime_checkable
class GraphEngine(Engine, Protocol):
    """An engine whose CUDA graphs point into the memory it releases (capability
    `cuda_graphs`)."""

    def destroy_graphs(self, ctx: StepContext) -> StepResult:
        """Releases CUDA graphs that point into released memory."""
        ...

    def recapture_graphs(self, ctx: StepContext) -> StepResult:
        """Undoes destroy_graphs on a live engine."""
        ...


@runtime_checkable
class RankedEngine(Engine, Protocol):
    """An engine whose tensor-parallel ranks report themselves (capability `rank_reports`)."""

    def check_ranks(self, ctx: StepContext) -> StepResult:
        """Raises unless every rank of a restored engine is there."""
        ...

    def tp_barrier(self, ctx: StepContext) -> StepResult:
        """Makes `tp_ranks` once every rank reported ready; names those that did not."""
        ...


@runtime_checkable
class WeightProvider(Component, Protocol):
    """Where weights come from. Capabilities: `payload` (PayloadProvider) or `checkpoint` (the
    pinned checkpoint, which `stage` verifies: nothing beyond this protocol)."""

    def launch_weights(self, ctx: StepContext) -> StepResult:
        """Makes `weight_source` at capture: what the engine starts with (a WeightSource)."""
        ...

    def stage(self, ctx: StepContext) -> StepResult:
        """Verifies the weights and makes `weight_source` for the engine."""
        ...


@runtime_checkable
class PayloadProvider(WeightProvider, Protocol):
    """A provider that keeps a payload the engine exports at capture (capability `payload`)."""

    def export(self, ctx: StepContext) -> StepResult:
        """Finds the payload the engine exported at release."""
        ...

    def discard_export(self, ctx: StepContext) -> StepResult:
        """Deletes what export found, unless the store adopted it."""
        ...


@runtime_checkable
class ArtifactStore(Component, Protocol):
    """Seals capsules at capture; admits them (compatibility) at restore."""

    def seal(self, ctx: StepContext) -> StepResult:
        """Publishes the capsule; records whether it created it before publishing."""
        ...

    def unpublish(self, ctx: StepContext) -> StepResult:
        """Undoes seal, leaving a capsule that existed before and giving its tag back."""
        ...

    def admit(self, ctx: StepContext) -> StepResult:
        """Checks the capsule against this runtime and lays its files out for the driver."""
        ...

    def discard_layout(self, ctx: StepContext) -> StepResult:
        """Undoes admit: removes what it laid out under the workdir (the store keeps all)."""
        ...


ROLES: dict[str, type[Component]] = {
    "driver": Driver,
    "engine": Engine,
    "provider": WeightProvider,
    "artifacts": ArtifactStore,
}


CAPABILITY_PROTOCOLS: dict[tuple[str, str], type[Component]] = {
    ("engine", "cuda_graphs"): GraphEngine,
    ("engine", "rank_reports"): RankedEngine,
    ("provider", "payload"): PayloadProvider,
}
"""(role, capability) -> the protocol of the methods that capability brings."""


def _methods(protocol: type) -> frozenset[str]:
    return frozenset(
        name
        for klass in protocol.__mro__
        if klass is not Component and Component in klass.__mro__
        for name, value in vars(klass).items()
        if callable(value) and not name.startswith("_")
    )


def declared_methods(role: str) -> frozenset[str]:
    """The step methods a role's protocols declare: its own and its capabilities'."""
    protocols = [ROLES[role], *(p for (r, _), p in CAPABILITY_PROTOCOLS.items() if r == role)]
    return frozenset().union(*(_methods(p) for p in protocols))


def capability_methods(role: str, capabilities: frozenset[str]) -> frozenset[str]:
    """The methods the capabilities of a component of `role` bring, beyond its role's (which
    the steps a request selects are checked for)."""
    protocols = [
        p for (r, cap), p in CAPABILITY_PROTOCOLS.items() if r == role and cap in capabilities
    ]
    return frozenset().union(*(_methods(p) - _methods(ROLES[role]) for p in protocols))


def check_components(spec: Spec, request: Request, components: Mapping[str, object]) -> None:
    """Fails closed when a component is not the one the request names, or lacks a method the
    request's steps (or their compensations) call."""
    expected = {"driver": request.driver, "provider": request.provider, "engine": request.engine}
    for role, name in expected.items():
        have = getattr(components[role], "name", None)
        if have != name:
            raise ComponentError(
                f"the request asks for {role} '{name}' but the machine has '{have}'"
            )
    for role, component in components.items():
        capabilities = getattr(component, "capabilities", None)
        if not isinstance(capabilities, frozenset):
            raise ComponentError(f"{role} '{component}' has no frozenset `capabilities`")
        if role == "driver":
            continue  # a driver's methods are those its own specs name (checked below)
        lacking = sorted(
            m for m in capability_methods(role, capabilities)
            if not callable(getattr(component, m, None))
        )
        if lacking:
            raise ComponentError(
                f"{role} '{getattr(component, 'name', '?')}' (capabilities: "
                f"{', '.join(sorted(capabilities)) or 'none'}) lacks {', '.join(lacking)}, "
                "which its capabilities' protocols declare"
            )
    for step in spec.selected(request, components):
        for action in filter(None, (step.action, step.compensation)):
            role, method = action.split(".", 1)
            if not callable(getattr(components[role], method, None)):
                raise ComponentError(
                    f"{role} '{getattr(components[role], 'name', '?')}' has no method '{method}' "
                    f"needed by step '{step.name}' of {spec.name}"
                )
