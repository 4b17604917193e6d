"""The machine package's one cattrs converter: requests, receipts and journal records."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError

from ._errors import RequestError
from ._requests import CaptureRequest, Request, RestoreRequest

converter = cattrs.Converter(forbid_extra_keys=True)

_KINDS: dict[str, type[CaptureRequest] | type[RestoreRequest]] = {
    CaptureRequest.KIND: CaptureRequest,
    RestoreRequest.KIND: RestoreRequest,
}


def parse_request(data: Mapping[str, Any]) -> Request:
    """Structures a request from plain data; every problem is reported with its field."""
    if not isinstance(data, Mapping):
        raise RequestError([("$", f"a request is a mapping, got {type(data).__name__}")])
    kind = data.get("kind")
    cls = _KINDS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise RequestError([("kind", f"unknown kind {kind!r} (known: {', '.join(_KINDS)})")])
    try:
        return converter.structure(dict(data), cls)
    except RequestError:
        raise
    except (ClassValidationError, ForbiddenExtraKeysError) as exc:
        raise RequestError(_problems(exc)) from None


def unstructure(obj: Any) -> Any:
    return converter.unstructure(obj)


def _problems(exc: Exception) -> list[tuple[str, str]]:
    nested = _nested_request_errors(exc)
    if nested:
        return [problem for error in nested for problem in error.problems]
    problems: list[tuple[str, str]] = []
    for line in cattrs.transform_error(exc):
        message, _, path = line.rpartition(" @ ")
        field = path.removeprefix("$").lstrip(".") or "$"
        if message.startswith("extra fields found"):
            extras = message.partition("(")[2].rstrip(")")
            for extra in extras.split(", "):
                name = f"{field}.{extra}" if field != "$" else extra
                problems.append((name, "unknown field"))
            continue
        problems.append((field, message))
    return problems or [("$", str(exc))]


def _nested_request_errors(exc: BaseException) -> list[RequestError]:
    """cattrs wraps errors raised by a class's own validation; unwrap them to keep field names."""
    if isinstance(exc, RequestError):
        return [exc]
    found: list[RequestError] = []
    for inner in getattr(exc, "exceptions", ()):
        found += _nested_request_errors(inner)
    return found
