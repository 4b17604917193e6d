"""The providers package's cattrs converter (pack indexes, pinned checkpoints), strict like the
artifacts one, and its JSON edge."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from coldsnap.artifacts import from_json, make_converter, to_json

T = TypeVar("T")

converter = make_converter()


def dumps(record: Any) -> bytes:
    return to_json(record, converter)


def loads(data: bytes | str | Mapping[str, Any], cls: type[T]) -> T:
    """Structures a provider record; a malformed one raises RecordError naming each field."""
    return from_json(data, cls, converter)
