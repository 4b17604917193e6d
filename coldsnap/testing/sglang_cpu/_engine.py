"""An SGLang engine registration that serves another SGLang release on CPU (tests).

`register_release_engine(registry, "0.5.17")` registers engine `sglang-0.5.17`: the SGLang
adapter whose launcher runs that release's overlay (`release_env`: the CPU support's
environment with the overlay on PYTHONPATH). The adapter takes the engine's identity (contract
digest) and the plugin digest in this process, so the process itself must run that release
(started with `release_env(release)`); building the engine anywhere else is refused.
"""

from __future__ import annotations

from typing import Any

from coldsnap.engines.sglang import SGLangEngine, SGLangLauncher
from coldsnap.engines.sglang.cpu import CPU_ARGS, CPU_MEMORY_ARGS, activate

from ._server import ReleaseNotInstalled, release_env, release_overlay


def release_engine_name(release: str) -> str:
    return f"sglang-{release}"


def build_release_engine(release: str) -> SGLangEngine:
    """The SGLang adapter for `release` on this CPU host (see the module's doc)."""
    overlay = release_overlay(release)
    activate()
    import sglang

    here = str(getattr(sglang, "__file__", ""))
    if overlay is not None and not here.startswith(str(overlay)):
        raise ReleaseNotInstalled(
            f"engine {release_engine_name(release)}: this process imports SGLang from {here}, "
            f"not from the {release} overlay {overlay}; the engine identity would name another "
            f"build (start this process with coldsnap.testing.sglang_cpu.release_env({release!r}))"
        )
    launcher = SGLangLauncher((*CPU_ARGS, *CPU_MEMORY_ARGS), release_env(release, {}))
    return SGLangEngine(launcher, name=release_engine_name(release))


def register_release_engine(registry: Any, release: str) -> str:
    """Registers engine `sglang-<release>`; returns its name."""
    name = release_engine_name(release)
    registry.register_engine(
        name,
        build=lambda request: build_release_engine(release),
        doc=f"SGLang {release} on CPU from its overlay (tests)",
    )
    return name
