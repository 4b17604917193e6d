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
start on different workers."""

from __future__ import annotations

import pytest

from tests._support import COMPONENTS, need, required


def pytest_configure(config: pytest.Config) -> None:
    required()  # a misspelt COLDSNAP_REQUIRE stops the run before any test


@pytest.hookimpl(tryfirst=True)  # before the `skipif` marks are evaluated: a requirement wins
def pytest_runtest_setup(item: pytest.Item) -> None:
    for component in COMPONENTS:
        if item.get_closest_marker(component) is not None:
            need(component)
