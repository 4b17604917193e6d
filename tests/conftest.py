"""Suite-wide: a test that needs CRIU or SGLang ends where the host lacks it, as a skip or, under
the required-components switch (`COLDSNAP_REQUIRE`, tests/_support.py), as a failure.

Which tests need what: those marked `criu` need CRIU, those marked `sglang` need SGLang; a
fixture that needs a component asks `tests._support.need` (or `missing`) itself.

Parallel runs (`make test`: pytest-xdist, `-n 2 --dist loadgroup`): every module that needs the
host declares one of two xdist groups in its `pytestmark`, and each group runs on one worker,
one test after the other (tests/test_suite_layout.py checks that no such module forgets it):
- "host": every module that starts an SGLang server or uses a GPU. These hosts have 2 cores:
  one SGLang server at a time is what the server tests were written for, and a module's shared
  server must live in one process.
- "toys": CRIU on small toy processes (no SGLang server), which take little CPU. They run on
  the other worker beside the server group, between the in-memory tests, instead of adding
  their minutes to the server group's. That is safe because nothing they share with a server
  test is left to chance: CRIU restores take a host-wide lock (backends.criu), every listener
  takes a random free port (`free_port`), a restore checks its PIDs are free before CRIU runs,
  and each test finds its leftovers by its own runtime dirs and PIDs, never by name.
The xdist scheduler hands out the largest groups first, one to each worker, so the two groups
start on different workers.

The server group is the run's critical path: it has minutes of work more than everything else
together. So under xdist (and as root, which may take a priority back) every test outside it
runs at a lower CPU priority (`BACKGROUND_NICE`, and so does every process it starts): on two
cores the other worker then takes the CPU time the server group leaves idle instead of slowing
its server starts and restores, while the server group's own tests run at the normal priority.
Nothing a test checks depends on it."""

from __future__ import annotations

import os

import pytest

from tests._support import COMPONENTS, need, required

SERVER_GROUP = "host"
"""The group of every module that starts an SGLang server or uses a GPU: one at a time."""
BACKGROUND_NICE = 10
"""The nice value of the tests outside SERVER_GROUP under xdist (0 is the normal priority)."""


def pytest_configure(config: pytest.Config) -> None:
    required()  # a misspelt COLDSNAP_REQUIRE stops the run before any test


@pytest.hookimpl(tryfirst=True)  # before the `skipif` marks are evaluated: a requirement wins
def pytest_runtest_setup(item: pytest.Item) -> None:
    _prioritise(item)
    for component in COMPONENTS:
        if item.get_closest_marker(component) is not None:
            need(component)


def nice_for(item: pytest.Item) -> int:
    """The nice value `item` runs at under xdist: 0 in SERVER_GROUP, BACKGROUND_NICE outside."""
    marker = item.get_closest_marker("xdist_group")
    group = None if marker is None else (marker.args or [marker.kwargs.get("name")])[0]
    return 0 if group == SERVER_GROUP else BACKGROUND_NICE


def _prioritise(item: pytest.Item) -> None:
    """Sets this thread's nice value (the one that runs the test and starts its processes) to
    `nice_for(item)`. Only in an xdist worker, and only as root: a worker may run tests outside
    the server group before it, and only root may raise a priority it lowered."""
    if "PYTEST_XDIST_WORKER" not in os.environ or os.geteuid() != 0:
        return
    want = nice_for(item)
    if os.getpriority(os.PRIO_PROCESS, 0) != want:
        os.setpriority(os.PRIO_PROCESS, 0, want)
