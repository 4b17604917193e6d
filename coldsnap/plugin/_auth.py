"""The API key check in the HTTP process: a keyed engine requires the key in its runtime
directory's key file, never the one SGLang was started with.

coldsnap starts a keyed engine with a key of its own (a throw-away at capture), so the key an
image holds in its server arguments, its HTTP middleware and its command line is never the
operator's. SGLang's middleware asks `sglang.srt.utils.auth.decide_request_auth` about every
request, passing the key it holds; this hook (AROUND, contract group "api key") answers with
the key file's key instead, read on every request: a restored process requires the key its
restore wrote there from its first request on, and without a readable key file no request that
needs a key passes (SGLang's own rule still opens its health, readiness and metrics paths,
which coldsnap's readiness probes use). An engine started without a key passes through: SGLang
then installs no key check that this could tighten.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coldsnap._wire import KeyFileError, read_key

logger = logging.getLogger("coldsnap.plugin")

AUTH_TARGET = "sglang.srt.utils.auth.decide_request_auth"
MIDDLEWARE_CONTRACT = "sglang.srt.utils.auth.add_api_key_middleware"


class KeyCheck:
    """The AROUND hook on AUTH_TARGET for the engine whose runtime directory is `runtime_dir`
    (None: no key file can exist, so a keyed engine answers no request that needs its key)."""

    def __init__(self, runtime_dir: Path | None) -> None:
        self.runtime_dir = runtime_dir

    def targets(self) -> list[tuple[str, str, Callable[..., Any]]]:
        return [(AUTH_TARGET, "AROUND", self.around_decide)]

    def current_key(self) -> str | None:
        """The key file's key now; None when there is none or it cannot be read (logged)."""
        if self.runtime_dir is None:
            return None
        try:
            return read_key(self.runtime_dir)
        except KeyFileError as exc:
            logger.error("coldsnap: %s; requests that need the API key are refused", exc)
            return None

    def around_decide(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("api_key"):
            return original(*args, **kwargs)
        key = self.current_key()
        if key is None:
            # No key to compare with: SGLang's own rule, asked with no credentials, refuses
            # every path that needs one and still opens its health and readiness paths.
            return original(*args, **{**kwargs, "authorization_header": None})
        return original(*args, **{**kwargs, "api_key": key})


def targets(role: str, runtime_dir: Path | None) -> list[tuple[str, str, Callable[..., Any]]]:
    """The key check's hooks for a process of `role`: the HTTP process only (it alone serves)."""
    return KeyCheck(runtime_dir).targets() if role == "main" else []


__all__ = ["AUTH_TARGET", "MIDDLEWARE_CONTRACT", "KeyCheck", "targets"]
