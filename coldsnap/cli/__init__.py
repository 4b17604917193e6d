"""The `coldsnap` command line (click)."""

import sys

# httpx's package import also imports httpx's own command-line client (rich's tables and
# progress, pygments, click's help): about 100 modules and 0.09 s on a 2-core host, paid by
# every `coldsnap restore`, `status` and `stop`, none of which runs that client. A None entry
# makes that one import fail, and httpx then binds a stub in its place (its documented
# fallback when those extras are missing). Set only here, in the command line's own process,
# and only when nothing imported the client first.
sys.modules.setdefault("httpx._main", None)

from ._main import main  # noqa: E402 (after the entry above)

__all__ = ["main"]
