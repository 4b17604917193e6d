"""A registry per test module: started once, each test pushing to its own repository."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ._server import serve_registry


@pytest.fixture(scope="module")
def registry_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("registry")


@pytest.fixture(scope="module")
def registry(registry_root: Path) -> Iterator[str]:
    """`127.0.0.1:PORT` of a real registry over plain HTTP."""
    with serve_registry(registry_root) as host:
        yield host
