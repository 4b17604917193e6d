"""The machine package's one cattrs converter: requests, receipts and journal records.

Strict: unknown keys are refused, and nothing is coerced. A string is not a bool (`"false"`),
a sequence of strings is a JSON array and never a string split into characters (`"--abc"`), an
int is an int and not a float (`2.7`) nor a bool; a float field takes an int or a float.
"""

from __future__ import annotations

import reprlib
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import cattrs
from cattrs.errors import BaseValidationError, ClassValidationError, ForbiddenExtraKeysError
from cattrs.v import format_exception

from ._errors import JournalError, RequestError
from ._requests import (
    CaptureRequest,
    Request,
    RestoreRequest,
    SleepRequest,
    StopRequest,
    WakeRequest,
)

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=True)

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlevel = 2


def _shown(value: Any) -> str:
    """`value` as a message quotes it: cut short, and safe however deep it nests (a request
    file's value can be a megabyte, or nested a thousand levels)."""
    return _REPR.repr(value)


def _exactly(kind: type, *accepted: type) -> Any:
    allowed = accepted or (kind,)

    def structure(value: Any, _: Any) -> Any:
        if isinstance(value, bool) and bool not in allowed:
            raise TypeError(f"expected {kind.__name__}, got a bool ({value!r})")
        if not isinstance(value, allowed):
            shown = _shown(value)
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} ({shown})")
        return kind(value) if kind is float else value

    return structure


for _kind, _accepted in ((str, (str,)), (int, (int,)), (float, (int, float)), (bool, (bool,))):
    converter.register_structure_hook(_kind, _exactly(_kind, *_accepted))


def _is_sequence(cl: Any) -> bool:
    return typing.get_origin(cl) in (tuple, list)


def _structure_sequence(value: Any, cl: Any) -> Any:
    if not isinstance(value, list | tuple):
        raise TypeError(f"expected a JSON array, got {type(value).__name__} ({_shown(value)})")
    args = typing.get_args(cl)
    if typing.get_origin(cl) is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        if len(args) != len(value):
            raise TypeError(f"expected {len(args)} items, got {len(value)}")
        return tuple(converter.structure(v, a) for v, a in zip(value, args, strict=True))
    item = args[0] if args else Any
    items = [converter.structure(v, item) for v in value]
    return tuple(items) if typing.get_origin(cl) is tuple else items


def _is_mapping(cl: Any) -> bool:
    return typing.get_origin(cl) is dict


def _structure_mapping(value: Any, cl: Any) -> Any:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a JSON object, got {type(value).__name__} ({_shown(value)})")
    key, item = typing.get_args(cl) or (Any, Any)
    out = {}
    for k, v in value.items():
        try:
            out[converter.structure(k, key)] = converter.structure(v, item)
        except TypeError as exc:
            raise TypeError(f"{exc} under key {_shown(k)}") from None
    return out


converter.register_structure_hook_func(_is_sequence, _structure_sequence)
converter.register_structure_hook_func(_is_mapping, _structure_mapping)


def structure_record(data: Any, cls: type[T], where: str) -> T:
    """A record of `cls` read from disk (a receipt, a journal line), strictly; a JournalError
    naming each bad field otherwise."""
    try:
        return converter.structure(data, cls)
    except (BaseValidationError, TypeError, ValueError) as exc:
        problems = _problems(exc) if isinstance(exc, BaseValidationError) else [("$", str(exc))]
        raise JournalError(
            f"{where}: not a {cls.__name__}: " + "; ".join(f"field '{f}': {m}" for f, m in problems)
        ) from None


REQUEST_CLASSES: tuple[type[Request], ...] = (
    CaptureRequest,
    RestoreRequest,
    StopRequest,
    SleepRequest,
    WakeRequest,
)
"""Every request class, by which `parse_request` reads a request's `kind`."""
_KINDS: dict[str, type[Request]] = {cls.KIND: cls for cls in REQUEST_CLASSES}


def parse_request(data: Mapping[str, Any]) -> Request:
    """Structures a request from plain data; every problem is reported with its field."""
    if not isinstance(data, Mapping):
        raise RequestError([("$", f"a request is a mapping, got {type(data).__name__}")])
    kind = data.get("kind")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RequestError([("kind", f"unknown kind {kind!r} (known: {', '.join(_KINDS)})")])
    try:
        return converter.structure(dict(data), cls)
    except RequestError:
        raise
    except (ClassValidationError, ForbiddenExtraKeysError) as exc:
        raise RequestError(_problems(exc)) from None
    except (TypeError, ValueError) as exc:
        raise RequestError([("$", str(exc))]) from None


def unstructure(obj: Any) -> Any:
    return converter.unstructure(obj)


def _problems(exc: Exception) -> list[tuple[str, str]]:
    nested = _nested_request_errors(exc)
    if nested:
        return [problem for error in nested for problem in error.problems]
    problems: list[tuple[str, str]] = []
    for line in cattrs.transform_error(exc, format_exception=_say):
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


def _say(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, TypeError) and str(exc).startswith("expected"):
        return str(exc)  # our strict hooks' own words: what was expected and what came
    return format_exception(exc, type_)


def _nested_request_errors(exc: BaseException) -> list[RequestError]:
    """cattrs wraps errors raised by a class's own validation; unwrap them to keep field names."""
    if isinstance(exc, RequestError):
        return [exc]
    found: list[RequestError] = []
    for inner in getattr(exc, "exceptions", ()):
        found += _nested_request_errors(inner)
    return found
