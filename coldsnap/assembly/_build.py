"""Real components for a request: the drivers, providers, engine adapter and store that the
command line and the end-to-end tests hand to a Machine."""

from __future__ import annotations

from typing import Any

from coldsnap.drivers.n580 import N580Driver
from coldsnap.drivers.n610 import N610Driver, default_cuda
from coldsnap.engines import SGLANG_POLICY, EnginePolicy

from ._engine import HttpEngine
from ._launchers import SGLangLauncher, ToyLauncher
from ._providers import NativeProvider, RecoveryProvider
from ._store import StoreArtifacts

TOY_POLICY = EnginePolicy(name="toy")

# What an n580 template imports before it is dumped: the engine's heavy modules.
PRELOAD = {
    "toy": ("torch", "safetensors.torch", "coldsnap.testing.toy_engine"),
    "sglang": ("torch", "sglang.launch_server", "sglang.srt.entrypoints.http_server"),
}
# What the template's forkserver imports, so the engine's children start warm (None: no
# forkserver; the toy engine starts no children).
FORKSERVER_PRELOAD = {
    "toy": None,
    "sglang": (
        "torch",
        "sglang.srt.managers.scheduler",
        "sglang.srt.managers.detokenizer_manager",
        # Imports every model module (about a second): do it once, in the template.
        "sglang.srt.models.registry",
    ),
}


def components(
    request: Any,
    *,
    sglang_args: tuple[str, ...] = (),
    sglang_env: dict[str, str] | None = None,
    graphs: bool | None = None,
) -> dict[str, Any]:
    """Keyword arguments for `Machine(**components(request))`."""
    if request.engine == "toy":
        launcher: Any = ToyLauncher()
        policy = TOY_POLICY
    elif request.engine == "sglang":
        launcher = SGLangLauncher(sglang_args, sglang_env)
        policy = SGLANG_POLICY
    else:
        raise ValueError(f"engine: unknown engine {request.engine!r} (known: sglang, toy)")
    cuda = default_cuda()
    engine = HttpEngine(policy, graphs=cuda is not None if graphs is None else graphs)
    if request.driver == "n610":
        driver: Any = N610Driver(launcher=launcher, cuda=cuda)
    else:
        driver = N580Driver(
            launcher=launcher,
            preload=PRELOAD[request.engine],
            forkserver_preload=FORKSERVER_PRELOAD[request.engine],
        )
    provider = NativeProvider() if request.provider == "native" else RecoveryProvider()
    return {
        "driver": driver,
        "provider": provider,
        "engine": engine,
        "artifacts": StoreArtifacts(engine),
    }
