"""Facts: the named values steps hand each other through the journal, declared once.

A step says which facts it `needs` and which it `makes`; a spec is refused at definition when a
step needs a fact no earlier step on its path makes, and the runner refuses a step that returns
or records a fact it does not declare. A fact marked `carried` travels from capture to restore
inside the capsule's record, so the store knows what to keep without knowing any driver.
"""

from __future__ import annotations

import threading

from attrs import field, frozen
from attrs.validators import matches_re

from ._errors import SpecError

_NAME = r"^[a-z][a-z0-9_]*$"


@frozen
class Fact:
    """One named, JSON-able value a step makes for later steps (and for a resumed machine)."""

    name: str = field(validator=matches_re(_NAME))
    doc: str
    carried: bool = False


_DECLARED: dict[str, Fact] = {}
_LOCK = threading.Lock()


def fact(name: str, doc: str, *, carried: bool = False) -> Fact:
    """Declares a fact; declaring the same name twice must say the same thing."""
    declared = Fact(name, doc, carried)
    with _LOCK:
        known = _DECLARED.setdefault(name, declared)
    if known != declared:
        raise SpecError(f"fact '{name}' is declared twice, differently: {known} vs {declared}")
    return known


def declared_facts() -> dict[str, Fact]:
    """Every fact declared so far, by name."""
    with _LOCK:
        return dict(_DECLARED)


__all__ = ["Fact", "declared_facts", "fact"]
