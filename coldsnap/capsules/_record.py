"""The capture record: what a restore needs from its capture besides the files."""

from __future__ import annotations

from typing import Any, ClassVar

from attrs import field, frozen

from coldsnap.artifacts import validate as v

RECORD_NAME = "capture.json"
"""The capsule member that holds the capture record."""


@frozen(kw_only=True)
class CaptureRecord:
    """Which driver, provider and engine captured what model, and the capture's carried facts
    (those the spec's steps declare `carried`: how the engine answered, where it listened, and
    what the driver needs to restore it). The store copies them without reading them."""

    KIND: ClassVar[str] = "coldsnap.capture-record"

    driver: str = field(validator=v.text)
    provider: str = field(validator=v.text)
    engine: str = field(validator=v.text)
    model_id: str = field(validator=v.text)
    revision: str
    facts: dict[str, Any]
    format: int = field(default=1, validator=v.exactly(1))
    kind: str = field(default=KIND, validator=v.exactly(KIND))


__all__ = ["RECORD_NAME", "CaptureRecord"]
