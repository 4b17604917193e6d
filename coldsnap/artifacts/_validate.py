"""The attrs validators and converters of coldsnap's records (artifacts and providers alike).

Each checks one field where it is declared, so the rule holds however a record is built, and
names the field in its ValueError: `from_json` turns that into a RecordError line for the field.
Rules that span fields stay in the record's post-init hook.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable
from typing import Any, Protocol, TypeVar

import attrs

from ._names import digest_problem, member_name_problem

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]
_HOST_PATH = re.compile(r"^(/|~|[A-Za-z]:[\\/]|\\\\)")
_COUNT_LIMIT = 1 << 62


class _Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=_Named)


def problem(check: Callable[[object], str | None]) -> Validator:
    """A validator from a `*_problem` function, which says why a value is wrong (None if not)."""

    def validate(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if (why := check(value)) is not None:
            raise ValueError(f"{attribute.name}: {why}")

    return validate


digest = problem(digest_problem)
member_name = problem(member_name_problem)


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def text(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{attribute.name}: a non-empty string is required, got {value!r}")


def portable(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Non-empty text that is not a host path: a record must not bind one host's files."""
    text(inst, attribute, value)
    if _HOST_PATH.match(value):  # type: ignore[arg-type]
        raise ValueError(
            f"{attribute.name}: {value!r} is a host path; name the hub id (org/name) instead"
        )


def positive(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _int(value) or value < 1:  # type: ignore[operator]
        raise ValueError(f"{attribute.name}: a positive integer is required, got {value!r}")


def count(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A size, offset or index: a non-negative integer, below 2**62 so sums cannot overflow."""
    if not _int(value) or not 0 <= value < _COUNT_LIMIT:  # type: ignore[operator]
        raise ValueError(
            f"{attribute.name}: a non-negative integer below 2**62 is required, got {value!r}"
        )


def exactly(expected: object) -> Validator:
    """For `format` and `kind`: the one value this code reads and writes."""

    def validate(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value != expected:
            raise ValueError(f"{attribute.name}: expected {expected!r}, found {value!r}")

    return validate


def one_of(options: Collection[object]) -> Validator:
    def validate(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value not in options:
            known = sorted(options)  # type: ignore[type-var]
            raise ValueError(f"{attribute.name}: expected one of {known}, found {value!r}")

    return validate


def matches(pattern: re.Pattern[str], what: str) -> Validator:
    """A string the whole of which matches `pattern`; `what` says what such a string is."""

    def validate(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ValueError(f"{attribute.name}: {value!r} is not {what}")

    return validate


def unique_names(field: str, *, sort: bool = False) -> Callable[[Iterable[N]], tuple[N, ...]]:
    """A converter for a field of named items: a tuple (sorted by name when `sort`, so equal
    sets give equal records), refusing two items with one name."""

    def convert(value: Iterable[N]) -> tuple[N, ...]:
        items = tuple(sorted(value, key=lambda item: item.name)) if sort else tuple(value)
        names = [item.name for item in items]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"{field}: duplicate names {duplicates}")
        return items

    return convert


optional = attrs.validators.optional
