"""Errors of the weight providers. Raised before any byte is written unless said otherwise."""

from __future__ import annotations

from collections.abc import Sequence

from coldsnap._errors import OperationError


class ProviderError(OperationError):
    """Base of every error the weight providers raise on purpose."""


class _Lines(ProviderError):
    """An error made of one line per problem, under a headline."""

    def __init__(self, headline: str, lines: Sequence[str]) -> None:
        self.lines = tuple(lines)
        super().__init__("\n  ".join([headline, *self.lines]))


class LayoutMismatch(_Lines):
    """The destination tensors do not have the layout the pack was exported from (missing or
    extra tensor, dtype, shape, stride, size, aliasing). Nothing was written."""


class PackDamaged(_Lines):
    """A pack file is missing, truncated, or its bytes fail their checksum. Nothing was
    written (the check runs before the copy)."""


class CheckpointError(_Lines):
    """A pinned checkpoint is missing a file, or a file does not match its pinned digest or
    the model's tensors. Nothing was loaded."""


class HydrationFailed(ProviderError):
    """The copy itself failed part-way (an I/O error or a file changed after it was checked).
    The storages named in the message may be partly written; the caller must not serve them."""
