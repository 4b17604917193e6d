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
from collections.abc import Callable, Iterator
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
from ._spec import Spec

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
        cls: type | None = None,
        doc: str = "",
    ) -> Entry:
        """A driver and the two specs it owns. With `cls`, every `driver.*` method the specs
        name must exist on it; every other role's method must be declared on its protocol."""
        problems = []
        for spec, operation in ((capture, "capture"), (restore, "restore")):
            if spec.operation != operation or spec.driver != name:
                problems.append(
                    f"spec '{spec.name}' is a {spec.operation} spec of driver '{spec.driver}', "
                    f"not the {operation} spec of '{name}'"
                )
            problems += list(_action_problems(spec, cls))
        if problems:
            raise SpecError("\n".join(f"driver '{name}': {p}" for p in problems))
        return self._add(Entry("driver", name, build, doc, (capture, restore)))

    def register_provider(self, name: str, *, build: ProviderFactory, doc: str = "") -> Entry:
        return self._add(Entry("provider", name, build, doc))

    def register_engine(self, name: str, *, build: EngineFactory, doc: str = "") -> Entry:
        return self._add(Entry("engine", name, build, doc))

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
        """Every registered driver's specs, in driver-name order."""
        return tuple(s for name in self.names("driver") for s in self.get("driver", name).specs)

    def spec(self, operation: str, driver: str) -> Spec:
        for spec in self.get("driver", driver).specs:
            if spec.operation == operation:
                return spec
        raise RegistryError(f"driver '{driver}' has no {operation} spec")

    def spec_named(self, name: str) -> Spec:
        for spec in self.specs():
            if spec.name == name:
                return spec
        raise RegistryError(f"no registered driver owns a spec named '{name}'")

    def check(self, request: Any) -> None:
        """Refuses a request naming a driver, provider or engine not registered here, naming
        each such field and what is registered (a RequestError, before any side effect)."""
        problems = []
        for kind in ("driver", "provider", "engine"):
            value = getattr(request, kind)
            known = self.names(kind)  # type: ignore[arg-type]
            if value not in known:
                registered = ", ".join(known) or "none"
                problems.append((kind, f"unknown {kind} '{value}' (registered: {registered})"))
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


def _action_problems(spec: Spec, cls: type | None) -> Iterator[str]:
    for step in spec.steps:
        for action in filter(None, (step.action, step.compensation)):
            role, method = action.split(".", 1)
            if role == "driver":
                if cls is not None and not callable(getattr(cls, method, None)):
                    yield f"step '{step.name}': {cls.__name__} has no method '{method}'"
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
