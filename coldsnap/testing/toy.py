"""The toy engine (coldsnap.testing.toy_engine) as a registered engine, for the real drivers'
tests: a real HTTP engine process that starts in about a second and speaks the endpoints and
plugin files of SGLang that the machines use, so the SGLang adapter drives it unchanged.

    register_toy(registry)   # engine "toy"; unregister with registry.unregister("engine", "toy")
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any

from coldsnap.engines import EnginePolicy
from coldsnap.engines.sglang import SGLangEngine, SGLangLauncher
from coldsnap.machine import InstalledBuild, Registry

from . import toy_engine

NAME = "toy"
TOY_POLICY = EnginePolicy(name=NAME)


class ToyLauncher(SGLangLauncher):
    """`python -m coldsnap.testing.toy_engine`, with SGLang's command line and COLDSNAP_*
    variables; an n580 template imports what the toy engine needs, and no forkserver (the toy
    engine starts no children)."""

    module = "coldsnap.testing.toy_engine"
    template_preload: tuple[str, ...] = (
        "torch",
        "safetensors.torch",
        "coldsnap.testing.toy_engine",
    )
    forkserver_preload: tuple[str, ...] | None = None


def identity() -> InstalledBuild:
    """The toy engine's build: its name, version 1, and the digest of its source (which is
    also all that runs inside it: it loads no plugin)."""
    digest = "sha256:" + hashlib.sha256(inspect.getsource(toy_engine).encode()).hexdigest()
    return InstalledBuild(engine=NAME, version="1", contract=digest, plugin_digest=digest)


def build(request: Any) -> SGLangEngine:
    return SGLangEngine(ToyLauncher(), policy=TOY_POLICY, name=NAME, identity=identity)


def register_toy(registry: Registry) -> None:
    """Registers engine "toy" (the tests register it around their use and unregister it)."""
    registry.register_engine(
        NAME, build=build, doc="the tests' toy engine, through the SGLang adapter"
    )


__all__ = ["NAME", "TOY_POLICY", "ToyLauncher", "build", "identity", "register_toy"]
