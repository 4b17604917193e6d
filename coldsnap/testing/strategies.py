"""Hypothesis strategies over the machines' inputs: specs, requests, fault plans."""

from __future__ import annotations

from hypothesis import strategies as st

from coldsnap.machine import DRIVERS, PROVIDERS, SPECS, Spec

OPERATIONS = ("capture", "restore")


def variants() -> st.SearchStrategy[tuple[str, str, str]]:
    """(operation, driver, provider) triples covering every spec and provider variant."""
    return st.tuples(
        st.sampled_from(OPERATIONS), st.sampled_from(DRIVERS), st.sampled_from(PROVIDERS)
    )


def specs() -> st.SearchStrategy[Spec]:
    return st.sampled_from(sorted(SPECS.values(), key=lambda s: s.name))


def tags() -> st.SearchStrategy[str]:
    return st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True)


def bad_paths() -> st.SearchStrategy[str]:
    """Paths a request must refuse: relative, empty, or under a parent that does not exist."""
    return st.one_of(
        st.just(""),
        st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8}){0,2}", fullmatch=True),
        st.from_regex(r"/nonexistent-[a-z]{4,8}/[a-z]{1,8}", fullmatch=True),
    )
