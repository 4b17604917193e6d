"""What this host must offer an operation, checked before the operation starts anything.

A request can be well formed and its components registered, and the host still lack what they
need to run it (the configured CRIU binary is not there, or is too old). Found by the step that
first uses it, that is minutes later, after the engine started, and everything is compensated.
So a component that knows what its steps will need declares it for a request
(`HostBound.host_needs`), each need with a cheap probe, and the Machine asks every probe before
it takes the workdir's lock or writes a journal: one that fails refuses the operation at once
(`HostMissing`, which the command line exits 5 for), naming what is missing and what was found.

A probe must be cheap and certain: cheap, because every capture and restore pays it; certain,
because a need that the steps might do without would refuse operations that could have run.
A component that declares nothing (the test doubles among them) is not asked: the check belongs
to the real component, which knows the binary and the API it will call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from attrs import frozen

from ._errors import EnvironmentMissing, RefusedError

if TYPE_CHECKING:
    from ._requests import Request


@frozen
class HostNeed:
    """One thing a component needs of this host for an operation: `what` names it for an
    operator (`CRIU >= 4.2 at /usr/local/sbin/criu`), `probe` says why it is not usable here
    (what it found), or None when it is."""

    what: str
    probe: Callable[[], str | None]


@frozen
class Missing:
    """A need a probe found unmet: the role and name of the component that declared it, what
    it is and what the probe found."""

    role: str
    component: str
    what: str
    found: str

    def __str__(self) -> str:
        return f"{self.what} ({self.role} '{self.component}'): {self.found}"


@runtime_checkable
class HostBound(Protocol):
    """A component that declares what the host must offer for a request's operation."""

    def host_needs(self, request: Request) -> Sequence[HostNeed]:
        """The needs of `request`'s operation (none for an operation that needs nothing of
        the host, such as a stop); each probe is asked once, before anything starts."""
        ...


class HostMissing(RefusedError, EnvironmentMissing):
    """This host lacks what an operation needs; raised before the operation journals or starts
    anything, so nothing is left to compensate."""

    def __init__(self, operation: str, missing: Sequence[Missing]) -> None:
        self.operation = operation
        self.missing = tuple(missing)
        super().__init__(
            f"this host cannot run the {operation}, nothing was started: "
            + "; ".join(map(str, self.missing))
            + " (`coldsnap doctor` checks the host)"
        )


def host_missing(request: Request, components: Mapping[str, Any]) -> list[Missing]:
    """Every need of `request` that the components declare and this host does not meet, asking
    each component in role order (driver, provider, engine, artifacts)."""
    found = []
    for role, component in components.items():
        if not isinstance(component, HostBound):
            continue
        for need in component.host_needs(request):
            problem = need.probe()
            if problem is not None:
                found.append(Missing(role, str(component.name), need.what, problem))
    return found


def check_host(request: Request, components: Mapping[str, Any]) -> None:
    """Raises HostMissing naming every unmet need of `request` (host_missing)."""
    missing = host_missing(request, components)
    if missing:
        raise HostMissing(request.operation, missing)


__all__ = ["HostBound", "HostMissing", "HostNeed", "Missing", "check_host", "host_missing"]
