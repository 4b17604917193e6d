"""Where coldsnap keeps things on a host, in one place.

Under /run (a tmpfs, forgotten at reboot): what belongs to processes running now or to this
boot's checks: engines' runtime directories (their path is frozen into an n610 image, so it is
host-level and recreated at restore), n580 templates' control directories, the served engines
of the command line, and the node-local memos of verified objects and engine builds. Under
/var/lib: what outlives a reboot, the default capsule store.
"""

from __future__ import annotations

from pathlib import Path

HOST_RUN = Path("/run/coldsnap")
"""Node-local state of this boot; every folder below is private (0700) to its writer."""
ENGINES_ROOT = HOST_RUN / "engines"
"""One runtime directory per engine (the plugin's status records, the resume plan)."""
TEMPLATES_ROOT = HOST_RUN / "templates"
"""One control directory per n580 template."""
SERVING_ROOT = HOST_RUN / "serving"
"""The command line's records of served engines (by name)."""
VERIFIED_ROOT = HOST_RUN / "verified"
"""Store objects this node verified in full (coldsnap.capsules._verified)."""
HOST_STATE = Path("/var/lib/coldsnap")
"""What outlives a reboot."""
DEFAULT_STORE = HOST_STATE / "store"
"""The capsule store when none is named."""

__all__ = [
    "DEFAULT_STORE",
    "ENGINES_ROOT",
    "HOST_RUN",
    "HOST_STATE",
    "SERVING_ROOT",
    "TEMPLATES_ROOT",
    "VERIFIED_ROOT",
]
