"""Suite-wide: a test that needs CRIU or SGLang ends where the host lacks it, as a skip or, under
the required-components switch (`COLDSNAP_REQUIRE`, tests/_support.py), as a failure.

Which tests need what: those marked `criu` need CRIU, those marked `sglang` need SGLang; a
fixture that needs a component asks `tests._support.need` (or `missing`) itself.

Parallel runs (`make test`: pytest-xdist, `-n 2 --dist loadgroup`): every module that starts
real servers, CRIU or a GPU declares `pytest.mark.xdist_group("host")` in its `pytestmark`, so
its tests run on one worker, one after the other, while the in-memory tests run on the other
(tests/test_suite_layout.py checks that no such module forgets it). These hosts have 2 cores:
one SGLang server, CRIU dump or restore at a time is what the server tests were written for,
and a module's shared server must live in one process."""

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
