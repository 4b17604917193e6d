"""Suite-wide: under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`), every module that
starts real servers, CRIU or a GPU runs on one worker, one test after the other, as it would
without xdist; the in-memory tests run on the other worker meanwhile.

Why: these hosts have 2 cores. One SGLang server, CRIU dump or restore at a time is what the
server tests were written for (their timeouts, one port and one PID range in use at a time), and
a module's shared server must live in one process. Grouping whole modules keeps their
module-scoped fixtures in one worker."""

from __future__ import annotations

import pytest

SERIAL_MARKS = ("sglang", "criu", "gpu")
"""Markers whose tests must run one at a time: they start real processes that need the host."""
SERIAL_GROUP = "host"
"""The xdist group of those modules (`@pytest.mark.xdist_group`)."""


@pytest.hookimpl(trylast=True)  # after xdist's own hook, before the node ids go to its scheduler
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Puts every test of a module that has a test needing the host in SERIAL_GROUP.

    xdist's loadgroup sends a test to its group's worker by the `@group` suffix of its node id.
    pytest-xdist 3.8 writes that suffix to `item._nodeid`, which pytest 9.2 no longer reads (a
    node id is `item._id` there), so the suffix is set here; a grouped test left without it
    stops the run rather than letting two servers run at once."""
    serial = {item.path for item in items if _needs_the_host(item)}
    grouping = bool(config.getoption("loadgroup", default=False))
    for item in items:
        if item.path not in serial:
            continue
        item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))
        if grouping and "@" not in item.nodeid:
            _suffix(item, f"@{SERIAL_GROUP}")


def _needs_the_host(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) is not None for name in SERIAL_MARKS)


def _suffix(item: pytest.Item, suffix: str) -> None:
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # pytest before 9.2 reads `_nodeid`, as xdist expects
        item._nodeid = item.nodeid + suffix
    else:
        item._id = NodeId.parse(item.nodeid + suffix)  # type: ignore[attr-defined]
    if not item.nodeid.endswith(suffix):
        raise pytest.UsageError(f"{item.nodeid}: cannot put it in xdist group {SERIAL_GROUP}")
