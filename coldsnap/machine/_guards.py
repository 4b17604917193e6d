"""Guards: which steps of a spec a request runs, decided from the request and the components.

A guard is data (a name for the diagrams, a sentence for the docs) plus a predicate over the
request and the components. Guards that share a `group` are alternatives of which exactly one
holds (how the weights come back: a payload or a checkpoint); spec validation walks every
combination, so a fact one alternative makes and a later step needs must be made by all of them.
Components say what they can do in `capabilities`, so guards never branch on a component's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attrs import field, frozen
from attrs.validators import matches_re

Predicate = Callable[[Any, Mapping[str, Any]], bool]


@frozen
class Guard:
    name: str = field(validator=matches_re(r"^[a-z][a-z0-9_]*$"))
    doc: str
    test: Predicate = field(eq=False, repr=False)
    group: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.group is not None:
            members = _GROUPS.setdefault(self.group, [])
            if self not in members:
                members.append(self)

    def holds(self, request: Any, components: Mapping[str, Any]) -> bool:
        return bool(self.test(request, components))


_GROUPS: dict[str, list[Guard]] = {}


def group_members(group: str) -> tuple[Guard, ...]:
    """Every guard defined in `group`, used by a given spec or not: spec validation must walk
    the paths where a member the spec does not use is the one that holds."""
    return tuple(_GROUPS.get(group, ()))


def capability(role: str, name: str) -> Predicate:
    """A predicate: the component in `role` declares capability `name`."""

    def test(request: Any, components: Mapping[str, Any]) -> bool:
        return name in getattr(components[role], "capabilities", frozenset())

    return test


PAYLOAD = Guard(
    "payload",
    "the provider brings weights back from a payload exported at capture",
    capability("provider", "payload"),
    group="weights",
)
CHECKPOINT = Guard(
    "checkpoint",
    "the provider brings weights back from the pinned checkpoint",
    capability("provider", "checkpoint"),
    group="weights",
)
CUDA = Guard(
    "cuda",
    "the driver moves the engine's CUDA state through the driver's checkpoint API",
    capability("driver", "cuda"),
)
GRAPHS = Guard(
    "graphs",
    "the engine captures CUDA graphs that point into released memory",
    capability("engine", "cuda_graphs"),
)
RETIRE = Guard(
    "retire",
    "the request does not keep the source engine running",
    lambda request, components: not getattr(request, "keep_source", False),
)

__all__ = [
    "CHECKPOINT",
    "CUDA",
    "GRAPHS",
    "PAYLOAD",
    "RETIRE",
    "Guard",
    "Predicate",
    "capability",
]
