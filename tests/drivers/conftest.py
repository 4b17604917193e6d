from __future__ import annotations

import pytest

from coldsnap.machine import REGISTRY
from coldsnap.testing.toy import NAME, register_toy


@pytest.fixture(autouse=True, scope="module")
def toy_engine_registered():
    """Engine "toy" is known to requests and to `Machine.for_request` while a module runs."""
    register_toy(REGISTRY)
    yield
    REGISTRY.unregister("engine", NAME)
