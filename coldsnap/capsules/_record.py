"""The capture record: what a restore needs from its capture besides the files."""

from __future__ import annotations

from typing import Any, ClassVar

import cattrs
from attrs import field, frozen

from coldsnap.artifacts import from_json, make_converter
from coldsnap.artifacts import validate as v

RECORD_NAME = "capture.json"
"""The capsule member that holds the capture record."""


@frozen(kw_only=True)
class CaptureRecord:
    """Which driver, provider and engine captured what model with which engine arguments, and
    the capture's carried facts (those the spec's steps declare `carried`: how the engine
    answered, where it listened, and what the driver needs to restore it). The store copies
    them without reading them.

    Format 2 binds `engine_args` (admission compares them with the restore's, see
    the engine adapter's `engine_args_differences`); a format-1 record cannot be checked and is
    refused.
    Format 3 adds where the user's own launch command line served (`serve_port`,
    `serve_host`), where a restore serves by default; a format-2 record is still read (it has
    neither).
    Format 4 binds the request's `engine_options` (admission compares them with the restore's
    through the engine adapter's `engine_options_differences`); an older record has none, which
    is what its capture ran with (each option at the engine's default)."""

    KIND: ClassVar[str] = "coldsnap.capture-record"
    FORMAT: ClassVar[int] = 4
    READS: ClassVar[tuple[int, ...]] = (2, 3, 4)

    driver: str = field(validator=v.text)
    provider: str = field(validator=v.text)
    engine: str = field(validator=v.text)
    model_id: str = field(validator=v.text)
    revision: str
    facts: dict[str, Any]
    engine_args: tuple[str, ...] = ()
    engine_options: dict[str, str] = field(factory=dict)
    serve_port: int | None = None
    serve_host: str | None = None
    format: int = field(default=FORMAT, validator=v.one_of(READS))
    kind: str = field(default=KIND, validator=v.exactly(KIND))

    def __attrs_post_init__(self) -> None:
        if self.format < 3 and (self.serve_port is not None or self.serve_host is not None):
            raise ValueError(f"serve_port: a format-{self.format} record cannot carry it")
        if self.format < 4 and self.engine_options:
            raise ValueError(f"engine_options: a format-{self.format} record cannot carry them")


def _strict_args(value: Any, _: Any) -> tuple[str, ...]:
    """A JSON list of strings, never a string taken as its characters."""
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise TypeError(f"expected a list of strings, got {type(value).__name__} {value!r}")
    return tuple(value)


def _converter() -> cattrs.Converter:
    conv = make_converter()
    conv.register_structure_hook_func(lambda t: t == tuple[str, ...], _strict_args)
    return conv


RECORD_CONVERTER = _converter()
"""The artifacts' strict converter, with engine_args read only from a list of strings."""


def read_record(data: bytes | str) -> CaptureRecord:
    """A capture record from its JSON; RecordError names each bad field."""
    return from_json(data, CaptureRecord, RECORD_CONVERTER)


__all__ = ["RECORD_CONVERTER", "RECORD_NAME", "CaptureRecord", "read_record"]
