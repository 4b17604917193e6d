"""SGLang's policy: how the engine-neutral client speaks to SGLang."""

from __future__ import annotations

from coldsnap._wire import MEMORY_TAGS
from coldsnap.engines import EnginePolicy

SGLANG_POLICY = EnginePolicy(
    name="sglang",
    memory_tags=MEMORY_TAGS,
    # An update from disk flushes the prefix cache the old weights made.
    update_defaults={"flush_cache": True},
)

__all__ = ["SGLANG_POLICY"]
