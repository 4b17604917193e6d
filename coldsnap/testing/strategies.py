"""Hypothesis strategies over the machines' inputs: specs, requests' variants, the capabilities
of components, fault plans. Each reads a registry when it draws (the process-wide one unless
given), so a driver registered later is drawn too."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st

from coldsnap.machine import COMPONENTS, REGISTRY, Registry, Spec

from ._faults import FaultPlan

OPERATIONS = ("capture", "restore")

ROLE_CAPABILITIES: dict[str, tuple[frozenset[str], ...]] = {
    "driver": (frozenset(), frozenset({"cuda"})),
    "engine": (frozenset(), frozenset({"cuda_graphs"})),
    # the weights come back one way: exactly one of the `weights` group holds
    "provider": (frozenset({"payload"}), frozenset({"checkpoint"})),
    "artifacts": (frozenset(),),
}
"""What the built-in guards read, per role: each role's possible capability sets."""


def variants(registry: Registry = REGISTRY) -> st.SearchStrategy[tuple[str, str, str]]:
    """(operation, driver, provider) triples covering every registered spec and provider."""
    return st.deferred(
        lambda: st.tuples(
            st.sampled_from(OPERATIONS),
            st.sampled_from(registry.names("driver")),
            st.sampled_from(registry.names("provider")),
        )
    )


def specs(registry: Registry = REGISTRY) -> st.SearchStrategy[Spec]:
    """Every spec the registry's drivers own."""
    return st.deferred(lambda: st.sampled_from(registry.specs()))


def capabilities() -> st.SearchStrategy[dict[str, frozenset[str]]]:
    """role -> the capabilities its component declares."""
    return st.fixed_dictionaries(
        {role: st.sampled_from(ROLE_CAPABILITIES[role]) for role in COMPONENTS}
    )


def stand_ins(names: dict[str, str] | None = None) -> st.SearchStrategy[dict[str, Any]]:
    """role -> a stand-in that has only a name and capabilities: what guards may read."""
    names = names or {}
    return capabilities().map(
        lambda caps: {
            role: SimpleNamespace(name=names.get(role, role), capabilities=caps[role])
            for role in COMPONENTS
        }
    )


def fault_plans(actions: list[str]) -> st.SearchStrategy[FaultPlan]:
    """A plan failing none or one of `actions`."""
    return (st.none() | st.sampled_from(actions)).map(
        lambda fault: FaultPlan(fail={fault} if fault else set())
    )


def tags() -> st.SearchStrategy[str]:
    return st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True)


def bad_paths() -> st.SearchStrategy[str]:
    """Paths a request must refuse: relative, empty, or under a parent that does not exist."""
    return st.one_of(
        st.just(""),
        st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8}){0,2}", fullmatch=True),
        st.from_regex(r"/nonexistent-[a-z]{4,8}/[a-z]{1,8}", fullmatch=True),
    )
