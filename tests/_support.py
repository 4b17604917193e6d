"""What tests share that is not a fixture: the required-components switch and a free port.

The switch. A test that needs CRIU or SGLang skips where the host lacks it, so that the unit
tests run anywhere; but a suite whose end-to-end tests all skipped must not pass where they are
meant to run. `COLDSNAP_REQUIRE` (a comma-separated list of COMPONENTS; `make test` and CI set
`criu,sglang`, which the set-up installs) turns a missing required component into a failure.
It is read here and nowhere else; an unknown name is refused, so a typo cannot turn the switch
off. GPUs are not a component of the switch: CI has none, GPU tests always skip without one."""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Mapping
from typing import NoReturn

import pytest

REQUIRE_VAR = "COLDSNAP_REQUIRE"
COMPONENTS = ("criu", "sglang")
"""What the switch may require: CRIU >= 4.2 usable as root, SGLang importable."""


def required(environ: Mapping[str, str] = os.environ) -> frozenset[str]:
    """The components `COLDSNAP_REQUIRE` names; refuses a name that is not in COMPONENTS."""
    names = {n.strip() for n in environ.get(REQUIRE_VAR, "").split(",") if n.strip()}
    unknown = sorted(names - set(COMPONENTS))
    if unknown:
        raise pytest.UsageError(
            f"{REQUIRE_VAR}: unknown component(s) {', '.join(unknown)} "
            f"(known: {', '.join(COMPONENTS)})"
        )
    return frozenset(names)


def missing(component: str, why: str) -> NoReturn:
    """Ends the running test because `component` is not usable here: a failure when the
    switch requires it, a skip otherwise."""
    if component not in COMPONENTS:
        raise ValueError(f"component {component!r}: not one of {', '.join(COMPONENTS)}")
    if component in required():
        pytest.fail(f"{component} is required ({REQUIRE_VAR}) but missing: {why}")
    pytest.skip(why)


def need(component: str) -> None:
    """Returns where `component` is usable here; otherwise `missing` ends the test."""
    why = problem(component)
    if why is not None:
        missing(component, why)


@functools.cache
def problem(component: str) -> str | None:
    """Why `component` cannot be used on this host, or None (asked once per process: CRIU's
    check runs the binary)."""
    if component == "criu":
        from coldsnap.backends import Criu

        return Criu().problem()
    if component == "sglang":
        if importlib.util.find_spec("sglang") is None:
            return "SGLang is not installed (scripts/setup.sh sglang)"
        return None
    raise ValueError(f"component {component!r}: not one of {', '.join(COMPONENTS)}")


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, chosen as the product chooses an engine's
    (below the kernel's ephemeral range, which outgoing connections and port-0 listeners draw
    from): a test's server must not race those for its port."""
    from coldsnap.engines.sglang import free_port as product_free_port

    return product_free_port()
