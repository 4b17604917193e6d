"""Engine policies: everything engine-specific the client needs, as data.

The HTTP client is engine-neutral; a second engine is a second policy (its endpoints, memory
tags, request/response field names, acceptance request, timeouts), kept beside its adapter
(SGLang's: coldsnap.engines.sglang.SGLANG_POLICY).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

from coldsnap._wire import MEMORY_TAGS


def _frozen_map(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class Endpoints:
    health: str = "/health"
    health_generate: str = "/health_generate"
    ready: str = "/ready"
    ping: str = "/ping"  # the HTTP server alone (SGLang 0.5.17 and 0.5.23: SageMaker's probe)
    generate: str = "/generate"
    release: str = "/release_memory_occupation"
    resume: str = "/resume_memory_occupation"
    update_weights_from_disk: str = "/update_weights_from_disk"
    flush_cache: str = "/flush_cache"
    server_info: str = "/server_info"
    model_info: str = "/model_info"
    weights_checker: str = "/weights_checker"


@attrs.frozen(kw_only=True)
class GenerateDialect:
    """How a generate request and its answer are spelled by this engine."""

    text_field: str = "text"
    ids_field: str = "input_ids"
    sampling_field: str = "sampling_params"
    max_tokens_key: str = "max_new_tokens"
    greedy: Mapping[str, Any] = attrs.field(
        factory=lambda: {"temperature": 0.0}, converter=_frozen_map
    )
    output_ids_field: str = "output_ids"
    output_text_field: str = "text"
    meta_field: str = "meta_info"


@attrs.frozen(kw_only=True)
class AcceptanceRequest:
    """The greedy request whose token ids, recorded at capture, must match after restore."""

    prompt: str = "The quick brown fox jumps over the lazy dog. Snapshots restore"
    max_new_tokens: int = attrs.field(default=16)

    @max_new_tokens.validator
    def _positive(self, _attr: Any, value: int) -> None:
        if value < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {value}")


@attrs.frozen(kw_only=True)
class Timeouts:
    """Seconds per operation (the read timeout of its HTTP call)."""

    connect: float = 5.0
    health: float = 10.0
    generate: float = 120.0
    release: float = 300.0
    resume: float = 900.0
    update_weights: float = 900.0
    flush_cache: float = 60.0
    info: float = 30.0


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Bounded retries. Non-idempotent calls retry only when the request never got through."""

    attempts: int = 4
    wait_initial: float = 0.2
    wait_max: float = 2.0


@attrs.frozen(kw_only=True)
class EnginePolicy:
    name: str
    endpoints: Endpoints = attrs.field(factory=Endpoints)
    # The memory regions release and resume may name (default: those of coldsnap's plugin).
    memory_tags: tuple[str, ...] = MEMORY_TAGS
    dialect: GenerateDialect = attrs.field(factory=GenerateDialect)
    acceptance: AcceptanceRequest = attrs.field(factory=AcceptanceRequest)
    timeouts: Timeouts = attrs.field(factory=Timeouts)
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    # Extra fields of an update-from-disk request (SGLang: flush the cache the old weights made).
    update_defaults: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_map)

    def check_tags(self, tags: tuple[str, ...] | list[str] | None) -> list[str] | None:
        if tags is None:
            return None
        unknown = [t for t in tags if t not in self.memory_tags]
        if unknown:
            raise ValueError(
                f"unknown memory tag(s) {', '.join(unknown)} for {self.name} "
                f"(known: {', '.join(self.memory_tags)})"
            )
        return list(tags)
