"""The registry: drivers (with the specs they own), weight providers, engine adapters and
artifact stores, each registered by name with a factory that builds it for a request.

coldsnap's own packages and third parties register the same way: a function listed under the
entry-point group `coldsnap.registrations` is called the first time the registry is read, and
calls `register_driver` / `register_provider` / `register_engine` / `register_store`. A Machine
checks a request against its registry before the first step (`Registry.check`), so a new driver
or engine is one package plus its entry point; nothing in the machine lists them.
"""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

from attrs import frozen

from ._errors import RegistryError, RequestError, SpecError
from ._protocols import (
    ArtifactStore,
    Driver,
    Engine,
    WeightProvider,
    declared_methods,
)
from ._spec import OPERATIONS, Spec

ENTRY_POINT_GROUP = "coldsnap.registrations"
Kind = Literal["driver", "provider", "engine", "store"]

DriverFactory = Callable[[Any, Engine], Driver]
"""(request, engine adapter) -> driver: the engine adapter hands the driver its launcher."""
ProviderFactory = Callable[[Any], WeightProvider]
EngineFactory = Callable[[Any], Engine]
StoreFactory = Callable[[Any, Engine], ArtifactStore]
"""(request, engine adapter) -> store: the engine adapter names the build bound into capsules."""


@frozen
class Entry:
    kind: Kind
    name: str
    build: Callable[..., Any]
    doc: str = ""
    specs: tuple[Spec, ...] = ()
    capabilities: frozenset[str] = frozenset()
    """What the component declares it can do, at registration: the request rules read these
    (REQUEST_RULES), never its name."""
    cls: type | None = None
    """The component's class, where it registered one: an engine's request checks
    (`check_engine_args`, `check_engine_options`) are read from it without building it."""


@frozen(kw_only=True)
class Components:
    """The four components a Machine drives."""

    driver: Driver
    provider: WeightProvider
    engine: Engine
    artifacts: ArtifactStore

    def by_role(self) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "provider": self.provider,
            "engine": self.engine,
            "artifacts": self.artifacts,
        }


class Registry:
    """Names to factories, per kind. Registering a taken name is an error (no silent override);
    `unregister` exists for tests that register throwaway components."""

    def __init__(self, *, entry_points: bool = True) -> None:
        self._entries: dict[tuple[Kind, str], Entry] = {}
        self._lock = threading.RLock()
        self._entry_points = entry_points
        self._loaded = not entry_points

    # -- registering --------------------------------------------------------------------------

    def register_driver(
        self,
        name: str,
        *,
        capture: Spec,
        restore: Spec,
        build: DriverFactory,
        stop: Spec | None = None,
        cls: type | None = None,
        capabilities: Iterable[str] = (),
        doc: str = "",
    ) -> Entry:
        """A driver and the specs it owns (capture, restore and, once it has one, stop). With
        `cls`, every `driver.*` method the specs name must exist on it; every other role's
        method must be declared on its protocol."""
        specs = {"capture": capture, "restore": restore, "stop": stop}
        _check_owned("driver", name, specs, cls)
        return self._add(
            Entry("driver", name, build, doc, _present(specs), frozenset(capabilities))
        )

    def register_provider(
        self,
        name: str,
        *,
        build: ProviderFactory,
        capabilities: Iterable[str] = (),
        doc: str = "",
    ) -> Entry:
        """A weight provider; `capabilities` as its built components have them (`payload` or
        `checkpoint`): the request check reads them (a checkpoint provider needs `model`)."""
        return self._add(Entry("provider", name, build, doc, (), frozenset(capabilities)))

    def register_engine(
        self,
        name: str,
        *,
        build: EngineFactory,
        sleep: Spec | None = None,
        wake: Spec | None = None,
        cls: type | None = None,
        capabilities: Iterable[str] = (),
        doc: str = "",
    ) -> Entry:
        """An engine adapter and the specs it owns (sleep and wake: they act on a running
        engine's memory, whatever snapshotted it). With `cls`, every `engine.*` method its
        specs name must exist on it; without, each must be declared on the engine protocol.
        With `cls`, `check` also asks it about a request's engine arguments and options
        (building an adapter imports the engine, which a check must not wait for); without,
        they reach the engine's launcher unchecked here."""
        specs = {"sleep": sleep, "wake": wake}
        _check_owned("engine", name, specs, cls)
        return self._add(
            Entry("engine", name, build, doc, _present(specs), frozenset(capabilities), cls)
        )

    def register_store(self, name: str, *, build: StoreFactory, doc: str = "") -> Entry:
        return self._add(Entry("store", name, build, doc))

    def unregister(self, kind: Kind, name: str) -> None:
        with self._lock:
            self._entries.pop((kind, name), None)

    def _add(self, entry: Entry) -> Entry:
        with self._lock:
            key = (entry.kind, entry.name)
            if key in self._entries:
                raise RegistryError(f"a {entry.kind} named '{entry.name}' is already registered")
            self._entries[key] = entry
        return entry

    # -- reading ------------------------------------------------------------------------------

    def get(self, kind: Kind, name: str) -> Entry:
        self._load()
        with self._lock:
            entry = self._entries.get((kind, name))
        if entry is None:
            known = ", ".join(self.names(kind)) or "none"
            raise RegistryError(f"no {kind} named '{name}' is registered (known: {known})")
        return entry

    def names(self, kind: Kind) -> tuple[str, ...]:
        self._load()
        with self._lock:
            return tuple(sorted(n for k, n in self._entries if k == kind))

    def specs(self) -> tuple[Spec, ...]:
        """Every registered spec: the drivers' then the engines', each in name order."""
        return tuple(
            spec
            for kind in ("driver", "engine")
            for name in self.names(kind)  # type: ignore[arg-type]
            for spec in self.get(kind, name).specs  # type: ignore[arg-type]
        )

    def spec(self, operation: str, request: Any) -> Spec:
        """The spec of `operation` its owner registers: the driver or the engine `request`
        names (OPERATIONS says which). `request` may also be the owner's name itself."""
        if operation not in OPERATIONS:
            raise RegistryError(
                f"no operation '{operation}' (known: {', '.join(OPERATIONS)})"
            )
        kind = OPERATIONS[operation]
        owner = request if isinstance(request, str) else getattr(request, kind)
        for spec in self.get(kind, owner).specs:
            if spec.operation == operation:
                return spec
        raise RegistryError(f"{kind} '{owner}' has no {operation} spec")

    def spec_named(self, name: str) -> Spec:
        for spec in self.specs():
            if spec.name == name:
                return spec
        raise RegistryError(f"no registered driver or engine owns a spec named '{name}'")

    def capabilities(self, kind: Kind, name: str) -> frozenset[str]:
        """What the component registered as `name` declared it can do."""
        return self.get(kind, name).capabilities

    def restore_needs_model(self, request: Any) -> bool:
        """Whether a restore with this request's provider must name the model's checkpoint
        (`model`): its provider brings the weights back from it."""
        return "checkpoint" in self.capabilities("provider", request.provider)

    def check(self, request: Any) -> None:
        """Refuses a request naming a driver, provider or engine not registered here, naming
        each such field and what is registered, or one that the components it names cannot
        serve (REQUEST_RULES, read from their declared capabilities): a RequestError naming
        every such field, before any side effect."""
        problems = []
        for kind in ("driver", "provider", "engine"):
            value = getattr(request, kind)
            known = self.names(kind)  # type: ignore[arg-type]
            if value not in known:
                registered = ", ".join(known) or "none"
                problems.append((kind, f"unknown {kind} '{value}' (registered: {registered})"))
        if not problems:
            problems += _engine_problems(self.get("engine", request.engine).cls, request)
            problems += [p for rule in REQUEST_RULES for p in rule(self, request)]
        if problems:
            raise RequestError(problems)

    def components(self, request: Any, *, store: str = "store") -> Components:
        """Builds what `request` names: the engine first (drivers and stores need it)."""
        self.check(request)
        engine = self.get("engine", request.engine).build(request)
        return Components(
            driver=self.get("driver", request.driver).build(request, engine),
            provider=self.get("provider", request.provider).build(request),
            engine=engine,
            artifacts=self.get("store", store).build(request, engine),
        )

    def _load(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            self._loaded = True  # a registration that reads the registry must not recurse
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                try:
                    ep.load()(self)
                except RegistryError:
                    raise
                except Exception as exc:
                    raise RegistryError(
                        f"entry point '{ep.name}' ({ep.value}) of {ENTRY_POINT_GROUP} failed: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc


def _engine_problems(cls: type | None, request: Any) -> list[tuple[str, str]]:
    """What the engine adapter's class says of the request's engine arguments and options (a
    lifecycle request carries neither: its target's request was checked)."""
    if cls is None:
        return []
    problems: list[tuple[str, str]] = []
    if hasattr(request, "engine_args"):
        problems += cls.check_engine_args(request.engine_args)
    if hasattr(request, "engine_options"):
        problems += cls.check_engine_options(request.engine_options)
    return problems


def _model_for_checkpoint(registry: Registry, request: Any) -> list[tuple[str, str]]:
    if request.operation != "restore" or request.model is not None:
        return []
    if not registry.restore_needs_model(request):
        return []
    return [("model", f"provider '{request.provider}' brings the weights back from the pinned "
             "checkpoint: name it (its path)")]  # fmt: skip


def _graphs_set_at_capture(registry: Registry, request: Any) -> list[tuple[str, str]]:
    if request.operation != "restore" or not request.async_cuda_graphs:
        return []
    if "resumes_process" not in registry.capabilities("driver", request.driver):
        return []
    return [("async_cuda_graphs", f"driver '{request.driver}' resumes the captured process "
             "with its environment: set it in the capture request")]  # fmt: skip


def _replica_needs_pid_namespaces(registry: Registry, request: Any) -> list[tuple[str, str]]:
    if request.operation != "restore" or not request.replica:
        return []
    if "pid_namespaces" in registry.capabilities("driver", request.driver):
        return []
    return [("replica", f"driver '{request.driver}' cannot restore into a PID namespace of its "
             "own (it does not declare pid_namespaces)")]  # fmt: skip


def _timeouts_name_steps(registry: Registry, request: Any) -> list[tuple[str, str]]:
    """A timeout for a step the operation's spec does not have would replace nothing: a
    misspelt step name must not leave the step at its default unnoticed."""
    if not request.timeouts:
        return []
    steps = [step.name for step in registry.spec(request.operation, request).steps]
    return [(f"timeouts.{name}", f"names no step of {request.operation} (its steps: "
             f"{', '.join(steps)})") for name in request.timeouts if name not in steps]  # fmt: skip


REQUEST_RULES: tuple[Callable[[Registry, Any], list[tuple[str, str]]], ...] = (
    _model_for_checkpoint,
    _graphs_set_at_capture,
    _replica_needs_pid_namespaces,
    _timeouts_name_steps,
)
"""What a request must satisfy given the capabilities its components declared at
registration and the spec its operation runs (its timeouts name that spec's steps); each rule
returns (field, problem) pairs. The capabilities they read: a
provider's `checkpoint` (it brings the weights back from the pinned checkpoint, so a restore
names it in `model`), a driver's `resumes_process` (a restore resumes the captured process
with the environment it had at capture, so what that environment decides is set at capture)
and a driver's `pid_namespaces` (it can restore a `replica` into a PID namespace of its own)."""


def _present(specs: dict[str, Spec | None]) -> tuple[Spec, ...]:
    return tuple(spec for spec in specs.values() if spec is not None)


def _check_owned(
    kind: Literal["driver", "engine"], name: str, specs: dict[str, Spec | None], cls: type | None
) -> None:
    """Each spec is the one its keyword names, owned by `name`, and calls what exists."""
    problems = []
    for operation, spec in specs.items():
        if spec is None:
            continue
        if spec.operation != operation or spec.owner != name or spec.owner_kind != kind:
            problems.append(
                f"spec '{spec.name}' is a {spec.operation} spec of {spec.owner_kind} "
                f"'{spec.owner}', not the {operation} spec of {kind} '{name}'"
            )
        problems += list(_action_problems(spec, cls, kind))
    if problems:
        raise SpecError("\n".join(f"{kind} '{name}': {p}" for p in problems))


def _action_problems(spec: Spec, cls: type | None, owner: str = "driver") -> Iterator[str]:
    """The owner's own methods are checked against its class (when given): its specs may call
    methods its protocol does not list (the driver protocol lists only what the Machine itself
    calls). Every other role's method, and the owner's without a class unless it is a driver,
    must be declared on that role's protocol."""
    for step in spec.steps:
        for action in filter(None, (step.action, step.compensation)):
            role, method = action.split(".", 1)
            if role == owner and cls is not None:
                if not callable(getattr(cls, method, None)):
                    yield f"step '{step.name}': {cls.__name__} has no method '{method}'"
            elif role == owner == "driver":
                continue  # checked on the built component (check_components)
            elif method not in declared_methods(role):
                yield (
                    f"step '{step.name}': '{action}' is not declared on the {role} protocol "
                    f"(declared: {', '.join(sorted(declared_methods(role)))})"
                )


REGISTRY = Registry()
"""The process-wide registry; its entry points load on first read."""

__all__ = [
    "ENTRY_POINT_GROUP",
    "REGISTRY",
    "Components",
    "DriverFactory",
    "EngineFactory",
    "Entry",
    "ProviderFactory",
    "Registry",
    "StoreFactory",
]
