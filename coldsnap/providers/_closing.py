"""The context-manager half of the providers' resources (hydrators, open packs, mappings)."""

from __future__ import annotations

from typing import Self


class Closing:
    """A resource with a `close()`: `with Resource(...) as r:` closes it on the way out, also
    when the block raises."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
