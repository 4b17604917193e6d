"""Engine adapters: engine policies as data, one engine-neutral HTTP client, and per engine
(`coldsnap.engines.sglang`) its policy, launcher and the machine-side steps.

with EngineClient(url, SGLANG_POLICY) as engine:
    engine.wait_healthy(60)
    expected = engine.acceptance_tokens()      # at capture
    engine.release()                            # all memory tags
    ...
    engine.resume()                             # the plugin hydrates or recovers
    engine.accept(expected)                     # raises AcceptanceError on any difference
"""

from ._client import AcceptanceError, EngineClient, EngineError, Generation
from ._policy import (
    AcceptanceRequest,
    Endpoints,
    EnginePolicy,
    GenerateDialect,
    RetryPolicy,
    Timeouts,
)

__all__ = [
    "AcceptanceError",
    "AcceptanceRequest",
    "Endpoints",
    "EngineClient",
    "EngineError",
    "EnginePolicy",
    "GenerateDialect",
    "Generation",
    "RetryPolicy",
    "Timeouts",
]
