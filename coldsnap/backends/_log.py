"""Reading CRIU's logs: the first line that says what went wrong."""

from __future__ import annotations

import re
from pathlib import Path

# Lines CRIU prints as errors on every run here, although nothing is wrong.
HARMLESS_ERRORS: tuple[str, ...] = (
    "rlimit: Can't setup RLIMIT_NOFILE",  # a VM whose hard limit CRIU may not raise
)

# "(00.033714)  24974: Error (...)": a restored task's own lines carry its PID after the time.
_ERROR = re.compile(r"^(?:\(\s*[\d.]+\)\s*)?(?:\d+:\s*)?(Error \(.*)$")


def first_error(text: str) -> str | None:
    """CRIU's first `Error (file:line): ...` line that is not known to be harmless."""
    for line in text.splitlines():
        match = _ERROR.match(line.strip())
        if match and not any(h in line for h in HARMLESS_ERRORS):
            return match.group(1).strip()
    return None


def first_error_in(path: Path) -> str | None:
    try:
        return first_error(path.read_text(errors="replace"))
    except OSError:
        return None
