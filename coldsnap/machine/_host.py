"""The host-operations seam: how the machines act on a host they do not run on.

The embedding orchestrator supplies an implementation for remote hosts (its own agent, its own
credentials); coldsnap never opens SSH connections or holds credentials. `LocalHost` acts here.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class HostOps(Protocol):
    """Runs commands on one host for the drivers."""

    name: str

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess[str]: ...


class LocalHost:
    """The host this process runs on."""

    name = "local"

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            check=False,
        )
